// Single-process tests of the shared-memory store: publisher and subscribers
// are separate attachments (separate mappings) inside this process. The
// cross-process and crash tests are in shm_store_process_test.cc.
#include "sluice/checkpoint_engine/shm_store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "core/checksum.h"
#include "shm/shm_control.h"
#include "shm/shm_format.h"
#include "shm/shm_test_util.h"

namespace sluice::checkpoint_engine {
namespace {

using namespace std::chrono_literals;
using testing::CheckSnapshot;
using testing::MakeTensor;
using testing::MakeVersion;
using testing::TestLayout;

bool Contains(const Status& s, const std::string& needle) { return s.message().find(needle) != std::string::npos; }

class ShmStoreTest : public ::testing::Test {
 protected:
  void SetUp() override { prefix_ = testing::UniquePrefix(); }
  void TearDown() override {
    // Every test ends with all attachments gone: nothing may be left behind.
    EXPECT_EQ(testing::SegmentsWithPrefix(prefix_), std::vector<std::string>{});
    testing::RemoveSegmentsWithPrefix(prefix_);
  }

  ShmPublisherOptions PublisherOptions(const std::string& store = "w") {
    ShmPublisherOptions o;
    o.store_name = store;
    o.shm_prefix = prefix_;
    o.layout = TestLayout();
    o.max_readers = 4;
    o.max_pins_per_reader = 3;
    return o;
  }
  ShmSubscriberOptions SubscriberOptions(const std::string& store = "w") {
    ShmSubscriberOptions o;
    o.store_name = store;
    o.shm_prefix = prefix_;
    return o;
  }
  std::unique_ptr<ShmPublisher> MakePublisher(ShmPublisherOptions o) {
    auto p = ShmPublisher::Attach(std::move(o));
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? std::move(p).value() : nullptr;
  }
  std::unique_ptr<ShmPublisher> MakePublisher() { return MakePublisher(PublisherOptions()); }
  std::unique_ptr<ShmSubscriber> MakeSubscriber(const std::string& store = "w") {
    auto s = ShmSubscriber::Attach(SubscriberOptions(store));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }
  std::string SegmentPath(const std::string& suffix, const std::string& store = "w") {
    return "/" + prefix_ + "." + store + "." + suffix;
  }
  bool SegmentExists(const std::string& suffix, const std::string& store = "w") {
    return SharedMemorySegment::Open(SegmentPath(suffix, store), ShmAccess::kReadOnly).ok();
  }
  // Replaces segment `suffix` by `bytes` (to plant foreign or damaged segments).
  void PlantSegment(const std::string& suffix, const std::vector<std::byte>& bytes, const std::string& store = "w") {
    (void)SharedMemorySegment::Unlink(SegmentPath(suffix, store));
    auto seg = SharedMemorySegment::Create(SegmentPath(suffix, store), bytes.size());
    ASSERT_TRUE(seg.ok()) << seg.status().ToString();
    if (!bytes.empty()) std::memcpy(seg->data(), bytes.data(), bytes.size());
  }
  // The segment's inode: the same file under another name after recycling.
  uint64_t Inode(const std::string& suffix, const std::string& store = "w") {
    struct stat st;
    if (::stat(("/dev/shm" + SegmentPath(suffix, store)).c_str(), &st) != 0) return 0;
    return static_cast<uint64_t>(st.st_ino);
  }
  std::vector<std::byte> ReadSegment(const std::string& suffix, const std::string& store = "w") {
    auto seg = SharedMemorySegment::Open(SegmentPath(suffix, store), ShmAccess::kReadOnly);
    EXPECT_TRUE(seg.ok()) << seg.status().ToString();
    if (!seg.ok()) return {};
    return std::vector<std::byte>(seg->data(), seg->data() + seg->size());
  }

  std::string prefix_;
};

void ExpectServing(ShmSubscriber& sub, int64_t version) {
  auto h = sub.AcquireLatest();
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->version(), version);
  EXPECT_EQ(CheckSnapshot(*h, sub.layout()), "");
  EXPECT_TRUE(h->Verify().ok());
}

TEST_F(ShmStoreTest, PublishThenReadZeroCopyFromAnotherAttachment) {
  auto pub = MakePublisher();
  auto sub = MakeSubscriber();
  ASSERT_TRUE(pub && sub);
  EXPECT_EQ(sub->latest_version(), kNoVersion);
  EXPECT_EQ(sub->AcquireLatest().status().code(), StatusCode::kNotFound);
  EXPECT_EQ(sub->layout().size(), 4u);
  EXPECT_EQ(sub->version_bytes(), pub->version_bytes());
  EXPECT_EQ(pub->version_bytes(), size_t{(64 + 32 + 32 + 16) * 1024});

  ASSERT_TRUE(pub->Publish(1, MakeVersion(TestLayout(), 1)).ok());
  EXPECT_EQ(pub->latest_version(), 1);
  EXPECT_EQ(sub->latest_version(), 1);
  auto h = sub->AcquireLatest();
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->version(), 1);
  EXPECT_EQ(CheckSnapshot(*h, TestLayout()), "");
  EXPECT_TRUE(h->Verify().ok());

  auto w = h->tensor("embed");
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->dtype, DType::kF32);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{32, 512}));
  EXPECT_EQ(w->nbytes, 64u * 1024);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w->data) % shm::kTensorAlignment, 0u);
  // The checksum recorded by the publisher is the XXH64 of the bytes.
  auto sum = h->checksum("embed");
  ASSERT_TRUE(sum.ok());
  EXPECT_NE(*sum, 0u);
  EXPECT_EQ(h->tensor("nope").status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(h->tensor("nope").status(), "'nope'"));
  EXPECT_EQ(ShmVersionHandle().tensor("embed").status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(ShmVersionHandle().Verify().code(), StatusCode::kFailedPrecondition);

  // The view is read-only shared memory: the same bytes another Acquire sees.
  auto again = sub->Acquire(1);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->tensor("embed")->data, w->data);  // same attachment shares one mapping
}

TEST_F(ShmStoreTest, CopyToCopiesAndChecksDestinations) {
  auto pub = MakePublisher();
  auto sub = MakeSubscriber();
  ASSERT_TRUE(pub->Publish(3, MakeVersion(TestLayout(), 3)).ok());
  auto h = sub->AcquireLatest();
  ASSERT_TRUE(h.ok());
  const Layout layout = TestLayout();
  std::vector<std::vector<std::byte>> buffers;
  for (const TensorSpec& spec : layout) buffers.emplace_back(CheckedNumel(spec.shape).value() * DTypeSize(spec.dtype));
  std::vector<std::span<std::byte>> spans(buffers.begin(), buffers.end());
  ASSERT_TRUE(h->CopyTo(spans).ok());
  for (size_t t = 0; t < layout.size(); ++t) {
    EXPECT_EQ(testing::CheckTensorBytes(layout[t], t, 3, buffers[t].data(), buffers[t].size()), "");
  }
  // Wrong count, wrong size: InvalidArgument naming the tensor, nothing copied.
  EXPECT_EQ(h->CopyTo(std::span(spans).first(2)).code(), StatusCode::kInvalidArgument);
  spans[1] = spans[1].first(8);
  Status wrong = h->CopyTo(spans);
  EXPECT_EQ(wrong.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(wrong, "'w_i64'")) << wrong.ToString();

  std::vector<std::byte> norm(16 * 1024);
  ASSERT_TRUE(h->CopyTensorTo("norm", norm).ok());
  EXPECT_EQ(testing::CheckTensorBytes(layout[3], 3, 3, norm.data(), norm.size()), "");
  EXPECT_EQ(h->CopyTensorTo("norm", std::span(norm).first(4)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(h->CopyTensorTo("nope", norm).code(), StatusCode::kNotFound);
}

TEST_F(ShmStoreTest, SupersededUnpinnedVersionsAreFreedAndPinnedOnesStay) {
  auto pub = MakePublisher();
  auto sub = MakeSubscriber();
  ASSERT_TRUE(pub->Publish(1, MakeVersion(TestLayout(), 1)).ok());
  auto v1 = sub->AcquireLatest();
  ASSERT_TRUE(v1.ok());
  ASSERT_TRUE(pub->Publish(2, MakeVersion(TestLayout(), 2)).ok());
  ASSERT_TRUE(pub->Publish(3, MakeVersion(TestLayout(), 3)).ok());
  // v1 is pinned, v2 superseded and unpinned, v3 the latest.
  EXPECT_TRUE(SegmentExists("v1"));
  EXPECT_FALSE(SegmentExists("v2"));
  EXPECT_TRUE(SegmentExists("v3"));
  auto stats = pub->stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->versions.versions_in_memory, (std::vector<int64_t>{1, 3}));
  ASSERT_EQ(stats->versions.pinned.size(), 1u);
  EXPECT_EQ(stats->versions.pinned[0].version, 1);
  EXPECT_EQ(stats->versions.pinned[0].pins, 1);
  EXPECT_EQ(stats->versions.commits, 3u);
  EXPECT_EQ(stats->readers_attached, 1u);
  EXPECT_TRUE(stats->publisher_alive);

  // A pinned old version can be pinned again; a freed one is NotFound.
  auto again = sub->Acquire(1);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(CheckSnapshot(*again, TestLayout()), "");
  Status gone = sub->Acquire(2).status();
  EXPECT_EQ(gone.code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(gone, "latest is 3")) << gone.ToString();
  EXPECT_EQ(sub->Acquire(7).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(sub->Acquire(-1).status().code(), StatusCode::kNotFound);

  // A tensor view keeps the pin after every handle is gone.
  auto view = v1->tensor("norm");
  ASSERT_TRUE(view.ok());
  *v1 = ShmVersionHandle();
  *again = ShmVersionHandle();
  EXPECT_TRUE(SegmentExists("v1"));
  EXPECT_EQ(testing::CheckTensorBytes(TestLayout()[3], 3, 1, view->data, view->nbytes), "");
  *view = HostTensor();
  // The last pin dropped: the reader frees the superseded version itself.
  EXPECT_FALSE(SegmentExists("v1"));
  stats = sub->stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->versions.versions_in_memory, (std::vector<int64_t>{3}));
  EXPECT_TRUE(stats->versions.pinned.empty());
}

TEST_F(ShmStoreTest, MemoryStaysWithinTheBoundWhileReadersHoldOldVersions) {
  auto pub = MakePublisher();
  std::vector<std::unique_ptr<ShmSubscriber>> subs;
  for (int i = 0; i < 3; ++i) subs.push_back(MakeSubscriber());
  std::vector<ShmVersionHandle> held;
  std::mt19937 rng(7);
  for (int64_t v = 1; v <= 30; ++v) {
    auto begin = pub->BeginPublish(v);
    ASSERT_TRUE(begin.ok()) << begin.status().ToString();
    auto& handle = *begin;
    const TensorMap tensors = MakeVersion(TestLayout(), v);
    for (const auto& [name, t] : tensors) ASSERT_TRUE(handle->Put(name, t).ok());
    // Mid-publish: staging counts against the bound too.
    auto mid = pub->stats();
    ASSERT_TRUE(mid.ok());
    EXPECT_EQ(mid->versions.staging_version, v);
    EXPECT_EQ(mid->versions.spare_bytes, 0u);  // the spare never exists next to a staging
    EXPECT_LE(mid->versions.bytes_held, mid->versions.max_bytes_held);
    EXPECT_EQ(testing::SegmentBytesWithPrefix(prefix_), mid->versions.bytes_held + mid->control_segment_bytes);
    ASSERT_TRUE(handle->Commit().ok());

    // Readers pin old versions at random and drop them at random.
    auto& sub = subs[rng() % subs.size()];
    if (rng() % 2 == 0) {
      auto h = sub->AcquireLatest();
      if (h.ok()) {
        held.push_back(*h);
      } else {
        EXPECT_EQ(h.status().code(), StatusCode::kResourceExhausted) << h.status().ToString();
      }
    }
    if (!held.empty() && rng() % 3 == 0) held.erase(held.begin() + static_cast<long>(rng() % held.size()));

    auto s = pub->stats();
    ASSERT_TRUE(s.ok());
    const VersionStoreStats& vs = s->versions;
    EXPECT_LE(vs.versions_in_memory.size(), vs.pinned.size() + 1) << "v" << v;
    EXPECT_LE(vs.bytes_held, vs.max_bytes_held);
    EXPECT_LE(vs.versions_in_memory.size(), size_t{s->max_readers} * s->max_pins_per_reader + 1);
    // What /dev/shm really holds: the versions in memory plus the control.
    EXPECT_EQ(testing::SegmentBytesWithPrefix(prefix_), vs.bytes_held + s->control_segment_bytes);
    for (const ShmVersionHandle& h : held) EXPECT_EQ(CheckSnapshot(h, TestLayout()), "");
  }
}

TEST_F(ShmStoreTest, PinsPerReaderAndReaderSlotsAreHardLimits) {
  ShmPublisherOptions o = PublisherOptions();
  o.max_readers = 2;
  o.max_pins_per_reader = 2;
  auto pub = MakePublisher(o);
  auto a = MakeSubscriber();
  auto b = MakeSubscriber();
  ASSERT_TRUE(a && b);
  Status full = ShmSubscriber::Attach(SubscriberOptions()).status();
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(full, "2 reader slots")) << full.ToString();

  std::vector<ShmVersionHandle> pins;
  for (int64_t v = 1; v <= 2; ++v) {
    ASSERT_TRUE(pub->Publish(v, MakeVersion(TestLayout(), v)).ok());
    auto h = a->AcquireLatest();
    ASSERT_TRUE(h.ok());
    pins.push_back(*h);
  }
  ASSERT_TRUE(pub->Publish(3, MakeVersion(TestLayout(), 3)).ok());
  Status third = a->AcquireLatest().status();
  EXPECT_EQ(third.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(third, "1, 2")) << third.ToString();
  // Re-pinning a version it already holds needs no new pin.
  EXPECT_TRUE(a->Acquire(2).ok());
  pins.erase(pins.begin());
  EXPECT_TRUE(a->AcquireLatest().ok());

  b.reset();  // a slot frees up
  EXPECT_TRUE(ShmSubscriber::Attach(SubscriberOptions()).ok());
}

TEST_F(ShmStoreTest, WaitForVersionWakesOnCommitAndTimesOut) {
  auto pub = MakePublisher();
  auto sub = MakeSubscriber();
  auto t0 = std::chrono::steady_clock::now();
  Status timeout = sub->WaitForVersion(1, 30ms).status();
  EXPECT_EQ(timeout.code(), StatusCode::kTimeout);
  EXPECT_TRUE(Contains(timeout, "latest is -1")) << timeout.ToString();
  EXPECT_TRUE(Contains(timeout, "is alive")) << timeout.ToString();
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 30ms);

  std::thread publisher([&] {
    std::this_thread::sleep_for(20ms);
    EXPECT_TRUE(pub->Publish(1, MakeVersion(TestLayout(), 1)).ok());
    EXPECT_TRUE(pub->Publish(2, MakeVersion(TestLayout(), 2)).ok());
  });
  auto h = sub->WaitForVersion(2, 10s);
  publisher.join();
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->version(), 2);
  EXPECT_EQ(CheckSnapshot(*h, TestLayout()), "");
  // Already there: returns at once with the latest.
  auto now = sub->WaitForVersion(1, 0ms);
  ASSERT_TRUE(now.ok());
  EXPECT_EQ(now->version(), 2);
}

TEST_F(ShmStoreTest, RejectsTensorsThatDoNotMatchTheLayout) {
  ShmPublisherOptions o = PublisherOptions();
  o.max_tensor_bytes = 64 * 1024;
  auto pub = MakePublisher(o);
  auto sub = MakeSubscriber();
  ASSERT_TRUE(pub->Publish(1, MakeVersion(TestLayout(), 1)).ok());
  const Layout layout = TestLayout();
  auto p = pub->BeginPublish(2);
  ASSERT_TRUE(p.ok());
  StagedWeights& h = **p;

  Status s = h.Put("nope", MakeTensor(layout[0], 0, 2));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s, "'nope'") && Contains(s, "not in the registered layout")) << s.ToString();

  HostTensor wrong_dtype = MakeTensor({"embed", DType::kI32, {32, 512}}, 0, 2);
  wrong_dtype.dtype = DType::kI32;
  s = h.Put("embed", wrong_dtype);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s, "dtype I32, layout expects F32")) << s.ToString();

  s = h.Put("embed", MakeTensor({"embed", DType::kF32, {512, 32}}, 0, 2));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s, "shape [512, 32], layout expects [32, 512]")) << s.ToString();

  HostTensor short_bytes = MakeTensor(layout[3], 3, 2);
  short_bytes.nbytes -= 4;
  s = h.Put("norm", short_bytes);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s, "does not match shape")) << s.ToString();

  HostTensor null_data = MakeTensor(layout[3], 3, 2);
  null_data.data = nullptr;
  EXPECT_EQ(h.Put("norm", null_data).code(), StatusCode::kInvalidArgument);

  HostTensor oversized = MakeTensor(layout[0], 0, 2);
  oversized.nbytes = 64 * 1024 + 1;
  s = h.Put("embed", oversized);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(s, "max_tensor_bytes")) << s.ToString();

  ASSERT_TRUE(h.Put("embed", MakeTensor(layout[0], 0, 2)).ok());
  EXPECT_EQ(h.Put("embed", MakeTensor(layout[0], 0, 2)).code(), StatusCode::kAlreadyExists);
  s = h.Commit();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(s, "3 of 4 layout tensors were not put") && Contains(s, "'w_i64'")) << s.ToString();
  // The publish stays open: putting the rest commits.
  for (size_t t = 1; t < layout.size(); ++t) ASSERT_TRUE(h.Put(layout[t].name, MakeTensor(layout[t], t, 2)).ok());
  ASSERT_TRUE(h.Commit().ok());
  EXPECT_EQ(h.Commit().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(h.Put("embed", MakeTensor(layout[0], 0, 2)).code(), StatusCode::kFailedPrecondition);
  ExpectServing(*sub, 2);

  // A layout tensor beyond max_tensor_bytes is refused at Attach.
  ShmPublisherOptions big = PublisherOptions("big");
  big.max_tensor_bytes = 1024;
  Status refused = ShmPublisher::Attach(big).status();
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(refused, "'embed'") && Contains(refused, "max_tensor_bytes")) << refused.ToString();
}

TEST_F(ShmStoreTest, RejectsVersionsThatDoNotIncrease) {
  auto pub = MakePublisher();
  auto sub = MakeSubscriber();
  ASSERT_TRUE(pub->Publish(5, MakeVersion(TestLayout(), 5)).ok());
  EXPECT_EQ(pub->BeginPublish(5).status().code(), StatusCode::kAlreadyExists);
  Status back = pub->BeginPublish(4).status();
  EXPECT_EQ(back.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(back, "older than the latest committed version 5")) << back.ToString();
  EXPECT_EQ(pub->BeginPublish(-1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pub->Publish(5, MakeVersion(TestLayout(), 5)).code(), StatusCode::kAlreadyExists);
  {
    auto open = pub->BeginPublish(7);
    ASSERT_TRUE(open.ok());
    Status second = pub->BeginPublish(8).status();
    EXPECT_EQ(second.code(), StatusCode::kFailedPrecondition);
    EXPECT_TRUE(Contains(second, "another publish is open")) << second.ToString();
    EXPECT_TRUE(SegmentExists("v7"));
  }  // destroyed uncommitted: aborted, staging segment gone, 7 reusable
  EXPECT_FALSE(SegmentExists("v7"));
  ExpectServing(*sub, 5);
  ASSERT_TRUE(pub->Publish(7, MakeVersion(TestLayout(), 7)).ok());
  auto stats = sub->stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->versions.aborts, 1u);  // only the staged 7; refused BeginPublish calls stage nothing
}

TEST_F(ShmStoreTest, CorruptStagedByteIsDataLossAndTheServingVersionIsUntouched) {
  auto pub = MakePublisher();
  auto sub = MakeSubscriber();
  ASSERT_TRUE(pub->Publish(1, MakeVersion(TestLayout(), 1)).ok());
  auto p = pub->BeginPublish(2);
  ASSERT_TRUE(p.ok());
  for (const auto& [name, t] : MakeVersion(TestLayout(), 2)) ASSERT_TRUE((*p)->Put(name, t).ok());
  EXPECT_TRUE((*p)->MutableStagedBytesForTesting("nope").empty());
  std::span<std::byte> staged = (*p)->MutableStagedBytesForTesting("w_i32");
  ASSERT_EQ(staged.size(), 32u * 1024);
  staged[1234] ^= std::byte{0x10};  // a stray bit flip between Put and Commit
  Status s = (*p)->Commit();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s, "'w_i32'") && Contains(s, "changed after Put")) << s.ToString();
  EXPECT_TRUE((*p)->MutableStagedBytesForTesting("w_i32").empty());
  EXPECT_FALSE(SegmentExists("v2"));
  EXPECT_EQ(sub->latest_version(), 1);
  ExpectServing(*sub, 1);
  auto stats = pub->stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->versions.staging_version, kNoVersion);
  EXPECT_EQ(stats->versions.aborts, 1u);
  // The version number is free again.
  ASSERT_TRUE(pub->Publish(2, MakeVersion(TestLayout(), 2)).ok());
  ExpectServing(*sub, 2);
}

TEST_F(ShmStoreTest, StageInPlaceWritesStraightIntoTheSegment) {
  auto pub = MakePublisher();
  auto sub = MakeSubscriber();
  ASSERT_TRUE(pub->Publish(1, MakeVersion(TestLayout(), 1)).ok());
  const TensorMap v2 = MakeVersion(TestLayout(), 2);
  auto p = pub->BeginPublish(2);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)->StageInPlace("nope").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*p)->SealInPlace("embed", 0).code(), StatusCode::kFailedPrecondition);
  for (const TensorSpec& spec : TestLayout()) {
    auto span = (*p)->StageInPlace(spec.name);
    ASSERT_TRUE(span.ok()) << span.status().ToString();
    const HostTensor& src = v2.at(spec.name);
    ASSERT_EQ(span->size(), src.nbytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(span->data()) % shm::kTensorAlignment, 0u);
    EXPECT_EQ((*p)->Put(spec.name, src).code(), StatusCode::kAlreadyExists);
    const size_t half = src.nbytes / 2;  // two pieces, as two network buckets
    std::memcpy(span->data() + half, src.data + half, src.nbytes - half);
    std::memcpy(span->data(), src.data, half);
    if (spec.name == "norm") {
      Status wrong = (*p)->SealInPlace(spec.name, 42);
      EXPECT_EQ(wrong.code(), StatusCode::kDataLoss);
      EXPECT_TRUE(Contains(wrong, "'norm'") && Contains(wrong, "unsealed")) << wrong.ToString();
      Status early = (*p)->Commit();
      EXPECT_EQ(early.code(), StatusCode::kFailedPrecondition);
      EXPECT_TRUE(Contains(early, "'norm' (staged in place, not sealed)")) << early.ToString();
    }
    ASSERT_TRUE((*p)->SealInPlace(spec.name, Checksum64(src.data, src.nbytes)).ok());
    EXPECT_EQ((*p)->SealInPlace(spec.name, 0).code(), StatusCode::kAlreadyExists);
  }
  ExpectServing(*sub, 1);
  ASSERT_TRUE((*p)->Commit().ok());
  ExpectServing(*sub, 2);
  auto h = sub->AcquireLatest();
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->checksum("embed").value(), Checksum64(v2.at("embed").data, v2.at("embed").nbytes));
}

TEST_F(ShmStoreTest, OnlyOneLivePublisherAndANewOneContinuesAfterDetach) {
  auto pub = MakePublisher();
  auto sub = MakeSubscriber();  // keeps the store alive across publishers
  ASSERT_TRUE(pub->Publish(1, MakeVersion(TestLayout(), 1)).ok());
  Status second = ShmPublisher::Attach(PublisherOptions()).status();
  EXPECT_EQ(second.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(second, "live publisher") && Contains(second, "this process")) << second.ToString();

  pub.reset();
  ExpectServing(*sub, 1);
  auto stats = sub->stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->publisher.pid, 0);
  pub = MakePublisher();
  ASSERT_TRUE(pub);
  EXPECT_EQ(pub->latest_version(), 1);
  EXPECT_EQ(pub->BeginPublish(1).status().code(), StatusCode::kAlreadyExists);
  ASSERT_TRUE(pub->Publish(2, MakeVersion(TestLayout(), 2)).ok());
  ExpectServing(*sub, 2);
}

TEST_F(ShmStoreTest, TheLastDetachRemovesEverySegment) {
  auto pub = MakePublisher();
  auto sub = MakeSubscriber();
  ASSERT_TRUE(pub->Publish(1, MakeVersion(TestLayout(), 1)).ok());
  auto h = sub->AcquireLatest();
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(pub->Publish(2, MakeVersion(TestLayout(), 2)).ok());
  auto open = pub->BeginPublish(3);
  ASSERT_TRUE(open.ok());
  EXPECT_EQ(testing::SegmentsWithPrefix(prefix_).size(), 4u);  // control, v1 (pinned), v2, staging v3
  pub.reset();                                                 // the open publish still holds the attachment
  EXPECT_TRUE(SegmentExists("v3"));
  open->reset();
  EXPECT_FALSE(SegmentExists("v3"));
  sub.reset();  // the handle still holds the attachment
  EXPECT_EQ(testing::SegmentsWithPrefix(prefix_).size(), 3u);
  EXPECT_EQ(CheckSnapshot(*h, TestLayout()), "");
  *h = ShmVersionHandle();
  EXPECT_EQ(testing::SegmentsWithPrefix(prefix_), std::vector<std::string>{});
}

TEST_F(ShmStoreTest, SubscriberWaitsForTheStoreWithinAttachTimeout) {
  ShmSubscriberOptions o = SubscriberOptions();
  Status missing = ShmSubscriber::Attach(o).status();
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(missing, "publisher")) << missing.ToString();

  std::unique_ptr<ShmPublisher> pub;
  std::thread creator([&] {
    std::this_thread::sleep_for(30ms);
    pub = MakePublisher();
    EXPECT_TRUE(pub->Publish(1, MakeVersion(TestLayout(), 1)).ok());
  });
  o.attach_timeout = 10s;
  o.expected_layout = TestLayout();
  auto sub = ShmSubscriber::Attach(o);
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  auto h = (*sub)->WaitForVersion(1, 10s);
  creator.join();
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(CheckSnapshot(*h, TestLayout()), "");
}

TEST_F(ShmStoreTest, LayoutMismatchIsRefusedWithTheDifferenceNamed) {
  auto pub = MakePublisher();
  ShmSubscriberOptions o = SubscriberOptions();
  o.expected_layout = TestLayout();
  (*o.expected_layout)[1].dtype = DType::kI32;
  Status s = ShmSubscriber::Attach(o).status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(s, "tensor 1: the store has 'w_i64' I64 [4096], expected 'w_i64' I32 [4096]")) << s.ToString();
  o.expected_layout->pop_back();
  (*o.expected_layout)[1].dtype = DType::kI64;
  s = ShmSubscriber::Attach(o).status();
  EXPECT_TRUE(Contains(s, "the store has 4 tensors, expected 3")) << s.ToString();

  auto sub = MakeSubscriber();
  pub.reset();
  ShmPublisherOptions other = PublisherOptions();
  other.layout[0].shape = {16, 512};
  s = ShmPublisher::Attach(other).status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(s, "'embed' F32 [32, 512], expected 'embed' F32 [16, 512]")) << s.ToString();
}

TEST_F(ShmStoreTest, ForeignTruncatedOrOtherProtocolControlSegmentsAreClearErrors) {
  // A valid control segment to damage in copies.
  std::vector<std::byte> good;
  {
    auto pub = MakePublisher(PublisherOptions("good"));
    good = ReadSegment("control", "good");
  }
  ASSERT_GT(good.size(), sizeof(shm::ControlBlock));

  ShmSubscriberOptions o = SubscriberOptions("bad");
  // Foreign: another magic.
  std::vector<std::byte> foreign(good.size(), std::byte{0x5a});
  PlantSegment("control", foreign, "bad");
  Status s = ShmSubscriber::Attach(o).status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(s, "not a Sluice CheckpointEngine segment")) << s.ToString();
  s = ShmPublisher::Attach(PublisherOptions("bad")).status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);

  // Another protocol version.
  std::vector<std::byte> other = good;
  reinterpret_cast<shm::SegmentPreamble*>(other.data())->protocol_version = 99;
  PlantSegment("control", other, "bad");
  s = ShmSubscriber::Attach(o).status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(s, "protocol version 99")) << s.ToString();
  s = ShmPublisher::Attach(PublisherOptions("bad")).status();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(s, "protocol version 99")) << s.ToString();

  // Truncated.
  PlantSegment("control", std::vector<std::byte>(good.begin(), good.begin() + good.size() / 2), "bad");
  s = ShmSubscriber::Attach(o).status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s, "header says")) << s.ToString();
  PlantSegment("control", std::vector<std::byte>(good.begin(), good.begin() + 10), "bad");
  EXPECT_EQ(ShmSubscriber::Attach(o).status().code(), StatusCode::kDataLoss);

  // Same size, inconsistent geometry.
  std::vector<std::byte> skewed = good;
  reinterpret_cast<shm::ControlBlock*>(skewed.data())->max_readers += 1;
  PlantSegment("control", skewed, "bad");
  s = ShmSubscriber::Attach(o).status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s, "inconsistent")) << s.ToString();

  // Never initialized (magic 0): Unavailable for a subscriber.
  std::vector<std::byte> uninit = good;
  std::memset(uninit.data(), 0, 8);
  PlantSegment("control", uninit, "bad");
  EXPECT_EQ(ShmSubscriber::Attach(o).status().code(), StatusCode::kUnavailable);

  ASSERT_TRUE(DestroyShmStore(prefix_, "bad").ok());
  EXPECT_FALSE(SegmentExists("control", "bad"));
}

// A creator that died before finishing the control segment (magic still 0)
// leaves it uninitialized forever; after a grace period (2 s) a publisher
// replaces it.
TEST_F(ShmStoreTest, ControlSegmentAbandonedDuringInitializationIsReplaced) {
  PlantSegment("control", std::vector<std::byte>(4096));
  EXPECT_EQ(ShmSubscriber::Attach(SubscriberOptions()).status().code(), StatusCode::kUnavailable);
  const auto t0 = std::chrono::steady_clock::now();
  auto pub = MakePublisher();
  ASSERT_TRUE(pub);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 2s);
  auto sub = MakeSubscriber();
  ASSERT_TRUE(pub->Publish(1, MakeVersion(TestLayout(), 1)).ok());
  ExpectServing(*sub, 1);
}

TEST_F(ShmStoreTest, DamagedVersionSegmentsAreDataLossNotCrashes) {
  auto pub = MakePublisher();
  auto sub = MakeSubscriber();
  ASSERT_TRUE(pub->Publish(1, MakeVersion(TestLayout(), 1)).ok());
  const std::vector<std::byte> good = ReadSegment("v1");

  struct Case {
    const char* what;
    std::vector<std::byte> bytes;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back({"truncated", std::vector<std::byte>(good.begin(), good.begin() + 5000), "header says"});
  cases.push_back({"tiny", std::vector<std::byte>(good.begin(), good.begin() + 7), "truncated"});
  std::vector<std::byte> foreign = good;
  std::memset(foreign.data(), 0x33, 8);
  cases.push_back({"foreign", foreign, "not a Sluice"});
  std::vector<std::byte> protocol = good;
  reinterpret_cast<shm::SegmentPreamble*>(protocol.data())->protocol_version = shm::kProtocolVersion + 5;
  cases.push_back({"protocol", protocol, "protocol version " + std::to_string(shm::kProtocolVersion + 5)});
  std::vector<std::byte> unsealed = good;
  reinterpret_cast<shm::VersionHeader*>(unsealed.data())->sealed.store(0);
  cases.push_back({"unsealed", unsealed, "not sealed"});
  std::vector<std::byte> other_version = good;
  reinterpret_cast<shm::VersionHeader*>(other_version.data())->version = 9;
  cases.push_back({"other version", other_version, "does not hold version 1"});
  std::vector<std::byte> bad_record = good;
  reinterpret_cast<shm::TensorRecord*>(reinterpret_cast<shm::VersionHeader*>(bad_record.data()) + 1)[2].offset += 8;
  cases.push_back({"bad record", bad_record, "'w_i32'"});
  std::vector<std::byte> flipped = good;
  flipped[good.size() - 100] ^= std::byte{1};
  cases.push_back({"flipped byte", flipped, ""});

  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    PlantSegment("v1", c.bytes);
    auto h = sub->AcquireLatest();
    if (std::string(c.what) == "flipped byte") {
      // Structurally fine; Verify (and a verified copy) catch the flip.
      ASSERT_TRUE(h.ok()) << h.status().ToString();
      Status v = h->Verify();
      EXPECT_EQ(v.code(), StatusCode::kDataLoss);
      EXPECT_TRUE(Contains(v, "'norm'")) << v.ToString();
      const Layout layout = TestLayout();
      std::vector<std::vector<std::byte>> buffers;
      for (const TensorSpec& spec : layout) {
        buffers.emplace_back(CheckedNumel(spec.shape).value() * DTypeSize(spec.dtype));
      }
      std::vector<std::span<std::byte>> spans(buffers.begin(), buffers.end());
      Status copied = h->CopyTo(spans);
      EXPECT_EQ(copied.code(), StatusCode::kDataLoss);
      EXPECT_TRUE(Contains(copied, "'norm'")) << copied.ToString();
      EXPECT_EQ(h->CopyTensorTo("norm", spans[3]).code(), StatusCode::kDataLoss);
      EXPECT_TRUE(h->CopyTensorTo("embed", spans[0]).ok());
      continue;
    }
    EXPECT_EQ(h.status().code(), StatusCode::kDataLoss);
    EXPECT_TRUE(Contains(h.status(), c.message)) << h.status().ToString();
    EXPECT_EQ(sub->Acquire(1).status().code(), StatusCode::kDataLoss);
  }
  // A failed pin is released: the subscriber can still pin its maximum.
  PlantSegment("v1", good);
  ASSERT_TRUE(pub->Publish(2, MakeVersion(TestLayout(), 2)).ok());
  ExpectServing(*sub, 2);
  auto stats = sub->stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_TRUE(stats->versions.pinned.empty());
}

TEST_F(ShmStoreTest, RejectsMalformedOptions) {
  ShmPublisherOptions o = PublisherOptions();
  o.store_name = "a.b";
  EXPECT_EQ(ShmPublisher::Attach(o).status().code(), StatusCode::kInvalidArgument);
  o.store_name = "";
  EXPECT_EQ(ShmPublisher::Attach(o).status().code(), StatusCode::kInvalidArgument);
  o = PublisherOptions();
  o.shm_prefix = "x/y";
  Status s = ShmPublisher::Attach(o).status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s, "shm_prefix")) << s.ToString();
  o = PublisherOptions();
  o.layout.clear();
  EXPECT_EQ(ShmPublisher::Attach(o).status().code(), StatusCode::kInvalidArgument);
  o = PublisherOptions();
  o.layout.push_back(o.layout[0]);
  s = ShmPublisher::Attach(o).status();
  EXPECT_TRUE(Contains(s, "duplicate")) << s.ToString();
  o = PublisherOptions();
  o.max_readers = 0;
  EXPECT_EQ(ShmPublisher::Attach(o).status().code(), StatusCode::kInvalidArgument);
  o = PublisherOptions();
  o.max_pins_per_reader = 65;
  EXPECT_EQ(ShmPublisher::Attach(o).status().code(), StatusCode::kInvalidArgument);
  ShmSubscriberOptions so = SubscriberOptions();
  so.store_name = "bad name";
  EXPECT_EQ(ShmSubscriber::Attach(so).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(ShmStoreTest, DestroyAndSweepRemoveTheStore) {
  EXPECT_EQ(SweepShmStore(prefix_, "w").code(), StatusCode::kNotFound);
  auto pub = MakePublisher();
  auto sub = MakeSubscriber();
  ASSERT_TRUE(pub->Publish(1, MakeVersion(TestLayout(), 1)).ok());
  // Live participants: a sweep changes nothing.
  ASSERT_TRUE(SweepShmStore(prefix_, "w").ok());
  ExpectServing(*sub, 1);
  ASSERT_TRUE(pub->Sweep().ok());

  auto h = sub->AcquireLatest();
  ASSERT_TRUE(h.ok());
  ASSERT_TRUE(DestroyShmStore(prefix_, "w").ok());
  EXPECT_EQ(testing::SegmentsWithPrefix(prefix_), std::vector<std::string>{});
  // Mappings stay valid; the participants learn the store is gone.
  EXPECT_EQ(CheckSnapshot(*h, TestLayout()), "");
  Status s = pub->Publish(2, MakeVersion(TestLayout(), 2));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(s, "destroyed")) << s.ToString();
  EXPECT_EQ(sub->Acquire(1).status().code(), StatusCode::kOk);  // still pinned by this attachment
  EXPECT_EQ(sub->Acquire(5).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(DestroyShmStore(prefix_, "w").ok());  // idempotent
}

TEST_F(ShmStoreTest, EmptyTensorsAreStoredAndRead) {
  ShmPublisherOptions o = PublisherOptions();
  o.layout = {{"empty", DType::kF32, {0, 7}}, {"one", DType::kI64, {1}}};
  auto pub = MakePublisher(o);
  auto sub = MakeSubscriber();
  TensorMap m;
  m["empty"] = HostTensor::Copy(DType::kF32, {0, 7}, nullptr, 0);
  int64_t x = 42;
  m["one"] = HostTensor::Copy(DType::kI64, {1}, &x, 8);
  ASSERT_TRUE(pub->Publish(0, m).ok());
  auto h = sub->AcquireLatest();
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->version(), 0);
  EXPECT_EQ(h->tensor("empty")->nbytes, 0u);
  int64_t got;
  std::memcpy(&got, h->tensor("one")->data, 8);
  EXPECT_EQ(got, 42);
  EXPECT_TRUE(h->Verify().ok());
}

// Threads of one process: one publishing, three pinning at random. Under TSan
// this checks the in-process side (subscriber cache, handles) for races.
TEST_F(ShmStoreTest, ConcurrentReadersInOneProcessSeeWholeVersions) {
  auto pub = MakePublisher();
  auto sub = MakeSubscriber();
  constexpr int64_t kVersions = 40;
  std::atomic<bool> done{false};
  std::vector<std::thread> readers;
  std::atomic<int> checked{0};
  for (int r = 0; r < 3; ++r) {
    readers.emplace_back([&, r] {
      std::mt19937 rng(r);
      const Layout layout = TestLayout();
      int64_t last = kNoVersion;
      const auto deadline = std::chrono::steady_clock::now() + 10s;
      while (!done.load() && std::chrono::steady_clock::now() < deadline) {
        auto h = (rng() % 2) ? sub->AcquireLatest() : sub->WaitForVersion(last + 1, 20ms);
        if (!h.ok()) {
          EXPECT_TRUE(h.status().code() == StatusCode::kNotFound || h.status().code() == StatusCode::kTimeout ||
                      h.status().code() == StatusCode::kResourceExhausted)
              << h.status().ToString();
          continue;
        }
        EXPECT_GE(h->version(), last);
        last = h->version();
        EXPECT_EQ(CheckSnapshot(*h, layout), "");
        checked.fetch_add(1);
      }
    });
  }
  for (int64_t v = 1; v <= kVersions; ++v) {
    ASSERT_TRUE(pub->Publish(v, MakeVersion(TestLayout(), v)).ok());
    std::this_thread::sleep_for(1ms);
  }
  done.store(true);
  for (auto& t : readers) t.join();
  EXPECT_GT(checked.load(), 0);
  ExpectServing(*sub, kVersions);
}

// The superseded version's segment becomes the spare and the next version is
// staged into it; the spare is counted, never coexists with a staging, and a
// pinned version is never recycled.
TEST_F(ShmStoreTest, TheSupersededSegmentIsRecycledForTheNextVersion) {
  auto pub = MakePublisher();
  auto sub = MakeSubscriber();
  auto expect_accounted = [&](const char* when) {
    auto s = pub->stats();
    ASSERT_TRUE(s.ok());
    EXPECT_LE(s->versions.bytes_held, s->versions.max_bytes_held) << when;
    EXPECT_EQ(testing::SegmentBytesWithPrefix(prefix_), s->versions.bytes_held + s->control_segment_bytes) << when;
  };
  ASSERT_TRUE(pub->Publish(1, MakeVersion(TestLayout(), 1)).ok());
  const uint64_t first = Inode("v1");
  ASSERT_NE(first, 0u);
  EXPECT_FALSE(SegmentExists("spare"));
  ASSERT_TRUE(pub->Publish(2, MakeVersion(TestLayout(), 2)).ok());
  // Version 1 was superseded and unpinned: its segment is the spare now.
  EXPECT_FALSE(SegmentExists("v1"));
  EXPECT_EQ(Inode("spare"), first);
  auto s = pub->stats();
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(s->recycle_segments);
  EXPECT_EQ(s->versions.spare_bytes, s->version_segment_bytes);
  EXPECT_EQ(s->versions.bytes_held, 2 * s->version_segment_bytes);
  EXPECT_EQ(s->segments_recycled, 0u);
  expect_accounted("after 2");

  // Staging 3 takes the spare: the same file, renamed.
  auto p = pub->BeginPublish(3);
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(SegmentExists("spare"));
  EXPECT_EQ(Inode("v3"), first);
  s = pub->stats();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->versions.spare_bytes, 0u);
  EXPECT_EQ(s->segments_recycled, 1u);
  expect_accounted("staging 3");
  for (const auto& [name, t] : MakeVersion(TestLayout(), 3)) ASSERT_TRUE((*p)->Put(name, t).ok());
  ExpectServing(*sub, 2);  // staging into a recycled segment changes nothing visible
  ASSERT_TRUE((*p)->Commit().ok());
  p->reset();
  ExpectServing(*sub, 3);

  // A pinned version is never recycled, however many versions follow.
  auto held = sub->AcquireLatest();
  ASSERT_TRUE(held.ok());
  const uint64_t pinned_inode = Inode("v3");
  for (int64_t v = 4; v <= 9; ++v) {
    ASSERT_TRUE(pub->Publish(v, MakeVersion(TestLayout(), v)).ok());
    EXPECT_NE(Inode("v" + std::to_string(v)), pinned_inode);
    EXPECT_EQ(CheckSnapshot(*held, TestLayout()), "") << "v" << v;
    expect_accounted("while 3 is pinned");
  }
  EXPECT_TRUE(held->Verify().ok());
  *held = ShmVersionHandle();  // 3 is freed (a spare exists already: truncated and unlinked)
  EXPECT_FALSE(SegmentExists("v3"));
  expect_accounted("after 3 is released");
  s = pub->stats();
  ASSERT_TRUE(s.ok());
  // 3, 4 and 6..9: when 4 was committed, 3 (pinned) could not become the
  // spare, so 5 got a fresh segment.
  EXPECT_EQ(s->segments_recycled, 6u);
  ExpectServing(*sub, 9);

  // The spare belongs to the publisher: it goes when the publisher detaches.
  ASSERT_TRUE(SegmentExists("spare"));
  pub.reset();
  EXPECT_FALSE(SegmentExists("spare"));
  ExpectServing(*sub, 9);
}

// The spare takes the staging version's place in the memory bound, so a
// version freed while another is staged is not kept.
TEST_F(ShmStoreTest, AVersionFreedWhileStagingIsNotKeptAsTheSpare) {
  auto pub = MakePublisher();
  auto sub = MakeSubscriber();
  ASSERT_TRUE(pub->Publish(1, MakeVersion(TestLayout(), 1)).ok());
  auto held = sub->AcquireLatest();
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(pub->Publish(2, MakeVersion(TestLayout(), 2)).ok());  // 1 stays: pinned
  auto p = pub->BeginPublish(3);                                    // no spare: a fresh segment
  ASSERT_TRUE(p.ok());
  *held = ShmVersionHandle();  // frees 1 while 3 is staged
  EXPECT_FALSE(SegmentExists("v1"));
  EXPECT_FALSE(SegmentExists("spare"));
  auto s = pub->stats();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->versions.spare_bytes, 0u);
  EXPECT_EQ(s->versions.bytes_held, 2 * s->version_segment_bytes);  // latest 2 and staging 3
  EXPECT_LE(s->versions.bytes_held, s->versions.max_bytes_held);
  EXPECT_EQ(testing::SegmentBytesWithPrefix(prefix_), s->versions.bytes_held + s->control_segment_bytes);
  for (const auto& [name, t] : MakeVersion(TestLayout(), 3)) ASSERT_TRUE((*p)->Put(name, t).ok());
  ASSERT_TRUE((*p)->Commit().ok());
  EXPECT_TRUE(SegmentExists("spare"));  // 2, freed at the commit
  ExpectServing(*sub, 3);
}

TEST_F(ShmStoreTest, RecyclingOffGivesEveryVersionAFreshSegment) {
  ShmPublisherOptions o = PublisherOptions();
  o.recycle_segments = false;
  auto pub = MakePublisher(o);
  auto sub = MakeSubscriber();
  uint64_t previous = 0;
  for (int64_t v = 1; v <= 5; ++v) {
    ASSERT_TRUE(pub->Publish(v, MakeVersion(TestLayout(), v)).ok());
    EXPECT_FALSE(SegmentExists("spare"));
    const uint64_t inode = Inode("v" + std::to_string(v));
    EXPECT_NE(inode, previous);
    previous = inode;
    ExpectServing(*sub, v);
  }
  auto s = pub->stats();
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(s->recycle_segments);
  EXPECT_EQ(s->segments_recycled, 0u);
  EXPECT_EQ(s->versions.spare_bytes, 0u);

  // A recycling publisher taking over keeps a spare; one that does not
  // removes it at attach.
  pub.reset();
  pub = MakePublisher();
  ASSERT_TRUE(pub->Publish(6, MakeVersion(TestLayout(), 6)).ok());
  EXPECT_TRUE(SegmentExists("spare"));
  pub.reset();
  EXPECT_FALSE(SegmentExists("spare"));
  pub = MakePublisher();
  ASSERT_TRUE(pub->Publish(7, MakeVersion(TestLayout(), 7)).ok());
  ASSERT_TRUE(SegmentExists("spare"));
  ASSERT_TRUE(SweepShmStore(prefix_, "w").ok());  // live participants: a sweep keeps it
  EXPECT_TRUE(SegmentExists("spare"));
  ExpectServing(*sub, 7);
}

// An aborted staging becomes the spare, and a spare that is not a whole
// segment of this store (planted from outside) is never staged into.
TEST_F(ShmStoreTest, AbortedStagingIsRecycledAndAForeignSpareIsRefused) {
  auto pub = MakePublisher();
  auto sub = MakeSubscriber();
  ASSERT_TRUE(pub->Publish(1, MakeVersion(TestLayout(), 1)).ok());
  {
    auto p = pub->BeginPublish(2);
    ASSERT_TRUE(p.ok());
  }  // aborted
  EXPECT_FALSE(SegmentExists("v2"));
  EXPECT_TRUE(SegmentExists("spare"));
  ASSERT_TRUE(pub->Publish(2, MakeVersion(TestLayout(), 2)).ok());
  ExpectServing(*sub, 2);

  // A spare of the wrong size (planted) is removed and a fresh segment used.
  ASSERT_TRUE(SegmentExists("spare"));  // version 1's
  PlantSegment("spare", std::vector<std::byte>(4096, std::byte{7}));
  ASSERT_TRUE(pub->Publish(3, MakeVersion(TestLayout(), 3)).ok());
  ExpectServing(*sub, 3);
  auto s = pub->stats();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->segments_recycled, 1u);  // only version 2 went into a spare
  EXPECT_EQ(testing::SegmentBytesWithPrefix(prefix_), s->versions.bytes_held + s->control_segment_bytes);
}

// A reader whose pins were taken from it while it still reads (its
// liveness misjudged, simulated here by clearing its pin in the control
// block) keeps its bytes: its flock keeps the segment from being recycled
// or truncated; it is only unlinked.
TEST_F(ShmStoreTest, ASegmentStillReadOutsideThePinsIsNeverRewritten) {
  auto pub = MakePublisher();
  auto sub = MakeSubscriber();
  ASSERT_TRUE(pub->Publish(1, MakeVersion(TestLayout(), 1)).ok());
  auto h = sub->AcquireLatest();
  ASSERT_TRUE(h.ok());
  const uint64_t inode = Inode("v1");
  {
    auto names = shm::StoreNames::Make(prefix_, "w");
    ASSERT_TRUE(names.ok());
    auto control = shm::Control::Open(*names);
    ASSERT_TRUE(control.ok()) << control.status().ToString();
    auto lock = (*control)->Lock(1s);
    ASSERT_TRUE(lock.ok());
    for (uint32_t i = 0; i < (*control)->geometry().max_readers; ++i) {
      for (uint32_t pin = 0; pin < (*control)->geometry().pins_per_reader; ++pin) {
        shm::SlotPins((*control)->slot(i))[pin].store(kNoVersion);
      }
    }
  }
  for (int64_t v = 2; v <= 6; ++v) {
    ASSERT_TRUE(pub->Publish(v, MakeVersion(TestLayout(), v)).ok());
    EXPECT_NE(Inode("v" + std::to_string(v)), inode) << "v" << v;
    EXPECT_NE(Inode("spare"), inode) << "v" << v;
    EXPECT_EQ(CheckSnapshot(*h, TestLayout()), "") << "v" << v;
  }
  EXPECT_FALSE(SegmentExists("v1"));  // unlinked, still mapped by the reader
  EXPECT_TRUE(h->Verify().ok());
  ExpectServing(*sub, 6);
}

// A reader pinning an older version races the publisher recycling that
// version's segment: either the pin lands first (the version stays whole
// until released) or the free does (NotFound). Threads of one process, each
// with its own attachment; bounded in versions and time.
TEST_F(ShmStoreTest, PinningRacesRecyclingWithoutTornReads) {
  ShmPublisherOptions o = PublisherOptions();
  o.max_readers = 4;
  o.max_pins_per_reader = 2;
  auto pub = MakePublisher(o);
  constexpr int64_t kVersions = 150;
  std::atomic<bool> done{false};
  std::atomic<int> old_pins{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 3; ++r) {
    readers.emplace_back([&, r] {
      auto sub = ShmSubscriber::Attach(SubscriberOptions());
      ASSERT_TRUE(sub.ok()) << sub.status().ToString();
      std::mt19937 rng(static_cast<uint32_t>(r));
      const Layout layout = TestLayout();
      const auto deadline = std::chrono::steady_clock::now() + 20s;
      while (!done.load() && std::chrono::steady_clock::now() < deadline) {
        const int64_t latest = (*sub)->latest_version();
        if (latest < 1) {
          std::this_thread::yield();
          continue;
        }
        // Mostly versions just superseded: the ones being recycled.
        const int64_t want = std::max<int64_t>(0, latest - static_cast<int64_t>(rng() % 3));
        auto h = (*sub)->Acquire(want);
        if (!h.ok()) {
          EXPECT_EQ(h.status().code(), StatusCode::kNotFound) << h.status().ToString();
          continue;
        }
        EXPECT_EQ(h->version(), want);
        EXPECT_EQ(CheckSnapshot(*h, layout), "");
        if (want < (*sub)->latest_version()) old_pins.fetch_add(1);
        if (rng() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
        EXPECT_TRUE(h->Verify().ok());
        EXPECT_EQ(CheckSnapshot(*h, layout), "");  // still whole after others recycled around it
      }
    });
  }
  // At least kVersions, and on until readers held 20 versions while they
  // were superseded (bounded: the race must be exercised, not just hoped for).
  int64_t v = 0;
  while (v < kVersions || (old_pins.load() < 20 && v < 20 * kVersions)) {
    ++v;
    ASSERT_TRUE(pub->Publish(v, MakeVersion(TestLayout(), v)).ok());
    if (v % 8 == 0) std::this_thread::sleep_for(100us);  // lets the readers in on a busy machine
  }
  done.store(true);
  for (auto& t : readers) t.join();
  auto s = pub->stats();
  ASSERT_TRUE(s.ok());
  // The race was exercised: most versions went into recycled segments, and
  // readers held versions that were superseded meanwhile.
  EXPECT_GT(s->segments_recycled, static_cast<uint64_t>(v / 4));
  EXPECT_GE(old_pins.load(), 20);
  EXPECT_EQ(testing::SegmentBytesWithPrefix(prefix_), s->versions.bytes_held + s->control_segment_bytes);
}

}  // namespace
}  // namespace sluice::checkpoint_engine
