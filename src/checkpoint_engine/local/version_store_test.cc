#include "sluice/checkpoint_engine/version_store.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/checksum.h"

namespace sluice::checkpoint_engine {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Small layout: w is 128 bytes, b is 128 bytes.
Layout SmallLayout() { return {{"w", DType::kF32, {4, 8}}, {"b", DType::kI64, {16}}}; }

std::unique_ptr<VersionStore> MakeStore(Layout layout = SmallLayout(), size_t max_pinned = 0,
                                        bool reuse_buffers = false) {
  VersionStoreOptions options;
  options.layout = std::move(layout);
  options.max_pinned_versions = max_pinned;
  options.reuse_buffers = reuse_buffers;
  auto store = VersionStore::Create(std::move(options));
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  return std::move(store).value();
}

// Every element encodes the version: F32 elements are version*1000 + i (exact
// in float for version < 16000 and i < 1000), I64 elements are
// version*1e6 + tensor_index*1e4 + i. A snapshot mixing two versions, or a
// tensor torn mid-copy, fails CheckSnapshot.
float F32Value(int64_t version, size_t i) {
  return static_cast<float>(version * 1000 + static_cast<int64_t>(i % 1000));
}
int64_t I64Value(int64_t version, size_t tensor_index, size_t i) {
  return version * 1000000 + static_cast<int64_t>(tensor_index) * 10000 + static_cast<int64_t>(i);
}

HostTensor MakeTensor(const TensorSpec& spec, size_t tensor_index, int64_t version) {
  size_t numel = 1;
  for (int64_t d : spec.shape) numel *= static_cast<size_t>(d);
  if (spec.dtype == DType::kF32) {
    std::vector<float> v(numel);
    for (size_t i = 0; i < numel; ++i) v[i] = F32Value(version, i);
    return HostTensor::Copy(spec.dtype, spec.shape, v.data(), v.size() * sizeof(float));
  }
  std::vector<int64_t> v(numel);
  for (size_t i = 0; i < numel; ++i) v[i] = I64Value(version, tensor_index, i);
  return HostTensor::Copy(spec.dtype, spec.shape, v.data(), v.size() * sizeof(int64_t));
}

TensorMap MakeVersion(const Layout& layout, int64_t version) {
  TensorMap map;
  for (size_t t = 0; t < layout.size(); ++t) map[layout[t].name] = MakeTensor(layout[t], t, version);
  return map;
}

// Empty string if every element of every tensor belongs to handle.version().
std::string CheckSnapshot(const VersionHandle& handle, const Layout& layout) {
  const int64_t version = handle.version();
  for (size_t t = 0; t < layout.size(); ++t) {
    auto tensor = handle.tensor(layout[t].name);
    if (!tensor.ok()) return tensor.status().ToString();
    const size_t numel = tensor->numel();
    for (size_t i = 0; i < numel; ++i) {
      if (layout[t].dtype == DType::kF32) {
        float got;
        std::memcpy(&got, tensor->data + i * sizeof(float), sizeof(float));
        if (got != F32Value(version, i)) {
          return "version " + std::to_string(version) + " tensor " + layout[t].name + "[" + std::to_string(i) +
                 "] = " + std::to_string(got);
        }
      } else {
        int64_t got;
        std::memcpy(&got, tensor->data + i * sizeof(int64_t), sizeof(int64_t));
        if (got != I64Value(version, t, i)) {
          return "version " + std::to_string(version) + " tensor " + layout[t].name + "[" + std::to_string(i) +
                 "] = " + std::to_string(got);
        }
      }
    }
  }
  return "";
}

bool Contains(const Status& s, const std::string& needle) { return s.message().find(needle) != std::string::npos; }

// The serving version is `version`, intact.
void ExpectServing(VersionStore& store, int64_t version) {
  auto h = store.AcquireLatest();
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->version(), version);
  EXPECT_EQ(CheckSnapshot(*h, store.layout()), "");
  EXPECT_TRUE(h->Verify().ok());
}

TEST(VersionStoreTest, PublishThenAcquireLatest) {
  auto store = MakeStore();
  EXPECT_EQ(store->latest_version(), kNoVersion);
  EXPECT_EQ(store->version_bytes(), 256u);
  auto none = store->AcquireLatest();
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);

  ASSERT_TRUE(store->Publish(1, MakeVersion(SmallLayout(), 1)).ok());
  auto h = store->AcquireLatest();
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->version(), 1);
  EXPECT_EQ(CheckSnapshot(*h, SmallLayout()), "");
  EXPECT_TRUE(h->Verify().ok());
  auto w = h->tensor("w");
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->dtype, DType::kF32);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(w->nbytes, 128u);
  auto missing = h->tensor("nope");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(missing.status(), "'nope'"));

  VersionStoreStats s = store->stats();
  EXPECT_EQ(s.latest_version, 1);
  EXPECT_EQ(s.commits, 1u);
  EXPECT_EQ(s.versions_in_memory, (std::vector<int64_t>{1}));
  EXPECT_EQ(s.bytes_held, 256u);
}

TEST(VersionStoreTest, AcquireSpecificVersion) {
  auto store = MakeStore();
  auto never = store->Acquire(7);
  EXPECT_EQ(never.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(Contains(never.status(), "version 7"));

  ASSERT_TRUE(store->Publish(1, MakeVersion(SmallLayout(), 1)).ok());
  auto h1 = store->AcquireLatest();
  ASSERT_TRUE(h1.ok());
  ASSERT_TRUE(store->Publish(2, MakeVersion(SmallLayout(), 2)).ok());
  {
    auto again = store->Acquire(1);  // still pinned by h1
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(again->version(), 1);
    EXPECT_EQ(CheckSnapshot(*again, SmallLayout()), "");
  }
  *h1 = VersionHandle();  // drop the last pin on version 1
  EXPECT_EQ(store->Acquire(1).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(store->Acquire(2)->version(), 2);
}

TEST(VersionStoreTest, VersionsOnlyIncrease) {
  auto store = MakeStore();
  ASSERT_TRUE(store->Publish(5, MakeVersion(SmallLayout(), 5)).ok());

  auto equal = store->BeginPublish(5);
  EXPECT_EQ(equal.status().code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(Contains(equal.status(), "version 5"));

  auto older = store->BeginPublish(3);
  EXPECT_EQ(older.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(older.status(), "version 3")) << older.status().ToString();
  EXPECT_TRUE(Contains(older.status(), "latest committed version 5")) << older.status().ToString();

  EXPECT_EQ(store->BeginPublish(-1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Publish(4, MakeVersion(SmallLayout(), 4)).code(), StatusCode::kFailedPrecondition);

  auto six = store->BeginPublish(6);
  ASSERT_TRUE(six.ok());
  auto concurrent = store->BeginPublish(7);
  EXPECT_EQ(concurrent.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(concurrent.status(), "version 6 is being staged")) << concurrent.status().ToString();
  (*six)->Abort();
  auto seven = store->BeginPublish(7);
  EXPECT_TRUE(seven.ok()) << seven.status().ToString();
  ExpectServing(*store, 5);
}

TEST(VersionStoreTest, AbortAndDestructionFreeStagingAndKeepServing) {
  auto store = MakeStore();
  const Layout layout = SmallLayout();
  ASSERT_TRUE(store->Publish(1, MakeVersion(layout, 1)).ok());
  {
    auto p = store->BeginPublish(2);
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE((*p)->Put("w", MakeTensor(layout[0], 0, 2)).ok());
    VersionStoreStats s = store->stats();
    EXPECT_EQ(s.staging_version, 2);
    EXPECT_EQ(s.staging_bytes, 128u);
    EXPECT_EQ(s.bytes_held, 256u + 128u);
    (*p)->Abort();
    s = store->stats();
    EXPECT_EQ(s.staging_version, kNoVersion);
    EXPECT_EQ(s.staging_bytes, 0u);
    EXPECT_EQ(s.bytes_held, 256u);
    EXPECT_EQ(s.aborts, 1u);
    EXPECT_EQ((*p)->Put("b", MakeTensor(layout[1], 1, 2)).code(), StatusCode::kFailedPrecondition);
    EXPECT_EQ((*p)->Commit().code(), StatusCode::kFailedPrecondition);
    ExpectServing(*store, 1);
  }
  {
    auto p = store->BeginPublish(2);  // an aborted number may be reused
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    ASSERT_TRUE((*p)->Put("w", MakeTensor(layout[0], 0, 2)).ok());
  }  // destroyed without Commit
  VersionStoreStats s = store->stats();
  EXPECT_EQ(s.staging_version, kNoVersion);
  EXPECT_EQ(s.staging_bytes, 0u);
  EXPECT_EQ(s.aborts, 2u);
  ExpectServing(*store, 1);
  ASSERT_TRUE(store->Publish(2, MakeVersion(layout, 2)).ok());
  ExpectServing(*store, 2);
}

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = MakeStore();
    ASSERT_TRUE(store_->Publish(1, MakeVersion(layout_, 1)).ok());
    auto p = store_->BeginPublish(2);
    ASSERT_TRUE(p.ok());
    publish_ = std::move(p).value();
  }
  void TearDown() override {
    publish_.reset();
    ExpectServing(*store_, 1);
    EXPECT_EQ(store_->stats().staging_version, kNoVersion);
  }
  const Layout layout_ = SmallLayout();
  std::unique_ptr<VersionStore> store_;
  std::unique_ptr<StagedWeights> publish_;
};

TEST_F(BadInputTest, UnknownTensorName) {
  Status s = publish_->Put("nope", MakeTensor(layout_[0], 0, 2));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s, "'nope'") && Contains(s, "not in the registered layout")) << s.ToString();
}

TEST_F(BadInputTest, WrongDtype) {
  std::vector<double> v(32, 2.0);
  Status s = publish_->Put("w", HostTensor::Copy(DType::kF64, {4, 8}, v.data(), v.size() * sizeof(double)));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s, "'w'") && Contains(s, "dtype F64, layout expects F32")) << s.ToString();
}

TEST_F(BadInputTest, WrongShape) {
  std::vector<float> v(32, 2.0f);
  Status s = publish_->Put("w", HostTensor::Copy(DType::kF32, {8, 4}, v.data(), v.size() * sizeof(float)));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s, "'w'") && Contains(s, "shape [8, 4], layout expects [4, 8]")) << s.ToString();
}

TEST_F(BadInputTest, NbytesInconsistentWithShape) {
  HostTensor t = MakeTensor(layout_[0], 0, 2);
  t.nbytes = 64;
  Status s = publish_->Put("w", t);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(s, "nbytes 64") && Contains(s, "128 bytes")) << s.ToString();
}

TEST_F(BadInputTest, MissingTensorAtCommitKeepsPublishOpen) {
  ASSERT_TRUE(publish_->Put("w", MakeTensor(layout_[0], 0, 2)).ok());
  Status s = publish_->Commit();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(s, "version 2") && Contains(s, "'b'") && Contains(s, "1 of 2")) << s.ToString();
  ExpectServing(*store_, 1);
  EXPECT_EQ(store_->stats().staging_version, 2);  // still open: the caller may put 'b' now
}

TEST_F(BadInputTest, DuplicatePut) {
  ASSERT_TRUE(publish_->Put("w", MakeTensor(layout_[0], 0, 2)).ok());
  Status s = publish_->Put("w", MakeTensor(layout_[0], 0, 2));
  EXPECT_EQ(s.code(), StatusCode::kAlreadyExists);
  EXPECT_TRUE(Contains(s, "'w'") && Contains(s, "already put")) << s.ToString();
  EXPECT_EQ(store_->stats().staging_bytes, 128u);  // the first copy only
}

TEST_F(BadInputTest, CorruptedStagedBytesDetectedAtCommit) {
  ASSERT_TRUE(publish_->Put("w", MakeTensor(layout_[0], 0, 2)).ok());
  ASSERT_TRUE(publish_->Put("b", MakeTensor(layout_[1], 1, 2)).ok());
  std::span<std::byte> bytes = publish_->MutableStagedBytesForTesting("b");
  ASSERT_EQ(bytes.size(), 128u);
  bytes[77] ^= std::byte{0x10};  // one flipped bit, as a memory fault would
  Status s = publish_->Commit();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(s, "version 2") && Contains(s, "'b'") && Contains(s, "aborted")) << s.ToString();
  EXPECT_EQ(store_->stats().aborts, 1u);
  EXPECT_EQ(publish_->Commit().code(), StatusCode::kFailedPrecondition);
}

// The cross-host transport fills staging in place, piece by piece, then
// seals each tensor against the checksum the sender computed.
TEST(VersionStoreTest, StageInPlaceThenSealCommitsAVersion) {
  auto store = MakeStore();
  const Layout layout = SmallLayout();
  ASSERT_TRUE(store->Publish(1, MakeVersion(layout, 1)).ok());
  const TensorMap v2 = MakeVersion(layout, 2);
  auto p = store->BeginPublish(2);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)->StageInPlace("nope").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*p)->SealInPlace("w", 0).code(), StatusCode::kFailedPrecondition);  // not staged yet
  auto w = (*p)->StageInPlace("w");
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_EQ(w->size(), 128u);
  auto again = (*p)->StageInPlace("w");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->data(), w->data());  // the same staging memory
  EXPECT_EQ((*p)->Put("w", v2.at("w")).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(store->stats().staging_bytes, 128u);
  // Two pieces, as two network buckets would land.
  std::memcpy(w->data(), v2.at("w").data, 64);
  std::memcpy(w->data() + 64, v2.at("w").data + 64, 64);
  const uint64_t sum = Checksum64(v2.at("w").data, 128);
  Status wrong = (*p)->SealInPlace("w", sum ^ 1);
  EXPECT_EQ(wrong.code(), StatusCode::kDataLoss);
  EXPECT_TRUE(Contains(wrong, "'w'") && Contains(wrong, "unsealed")) << wrong.ToString();
  // An unsealed tensor is missing for Commit (the publish stays open).
  ASSERT_TRUE((*p)->Put("b", v2.at("b")).ok());
  Status early = (*p)->Commit();
  EXPECT_EQ(early.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(early, "staged in place, not sealed")) << early.ToString();
  ASSERT_TRUE((*p)->SealInPlace("w", sum).ok());
  EXPECT_EQ((*p)->SealInPlace("w", sum).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ((*p)->StageInPlace("w").status().code(), StatusCode::kAlreadyExists);
  ExpectServing(*store, 1);  // nothing visible before Commit
  ASSERT_TRUE((*p)->Commit().ok());
  ExpectServing(*store, 2);
  auto h = store->AcquireLatest();
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->checksum("w").value(), sum);
  EXPECT_EQ((*p)->StageInPlace("w").status().code(), StatusCode::kFailedPrecondition);
}

TEST(VersionStoreTest, WriteIntoSealedStagingIsCaughtAtCommit) {
  auto store = MakeStore();
  const Layout layout = SmallLayout();
  ASSERT_TRUE(store->Publish(1, MakeVersion(layout, 1)).ok());
  const TensorMap v2 = MakeVersion(layout, 2);
  auto p = store->BeginPublish(2);
  ASSERT_TRUE(p.ok());
  for (const TensorSpec& spec : layout) {
    auto span = (*p)->StageInPlace(spec.name);
    ASSERT_TRUE(span.ok());
    std::memcpy(span->data(), v2.at(spec.name).data, span->size());
    ASSERT_TRUE((*p)->SealInPlace(spec.name, Checksum64(span->data(), span->size())).ok());
  }
  (*p)->MutableStagedBytesForTesting("b")[3] ^= std::byte{1};
  EXPECT_EQ((*p)->Commit().code(), StatusCode::kDataLoss);
  ExpectServing(*store, 1);
  EXPECT_EQ(store->stats().staging_bytes, 0u);
  EXPECT_EQ(store->stats().aborts, 1u);
}

TEST(VersionStoreTest, ReuseBuffersKeepsOneFreedVersionForTheNextPublish) {
  auto owned = MakeStore(SmallLayout(), 0, /*reuse_buffers=*/true);
  ASSERT_NE(owned, nullptr);
  VersionStore& store = *owned;
  const Layout layout = SmallLayout();
  const size_t vb = store.version_bytes();
  ASSERT_TRUE(store.Publish(1, MakeVersion(layout, 1)).ok());
  const std::byte* v1_w = store.AcquireLatest()->tensor("w")->data;
  const std::byte* v1_b = store.AcquireLatest()->tensor("b")->data;
  ASSERT_TRUE(store.Publish(2, MakeVersion(layout, 2)).ok());  // frees 1: its buffers become the spare
  VersionStoreStats s = store.stats();
  EXPECT_EQ(s.versions_in_memory, (std::vector<int64_t>{2}));
  EXPECT_EQ(s.spare_bytes, vb);
  EXPECT_EQ(s.bytes_held, 2 * vb);
  EXPECT_LE(s.bytes_held, s.max_bytes_held);
  // The next publish stages into them (Put and StageInPlace alike) ...
  auto p = store.BeginPublish(3);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE((*p)->Put("w", MakeTensor(layout[0], 0, 3)).ok());
  auto b = (*p)->StageInPlace("b");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->data(), v1_b);
  s = store.stats();
  EXPECT_EQ(s.spare_bytes, 0u);
  EXPECT_EQ(s.bytes_held, 2 * vb);  // latest + staging
  const HostTensor v3b = MakeTensor(layout[1], 1, 3);
  std::memcpy(b->data(), v3b.data, v3b.nbytes);
  ASSERT_TRUE((*p)->SealInPlace("b", Checksum64(v3b.data, v3b.nbytes)).ok());
  ASSERT_TRUE((*p)->Commit().ok());
  ExpectServing(store, 3);
  EXPECT_EQ(store.AcquireLatest()->tensor("w")->data, v1_w);
  // ... and a pinned old version is freed, not kept, while a spare exists.
  auto pinned = store.AcquireLatest();                         // 3
  ASSERT_TRUE(store.Publish(4, MakeVersion(layout, 4)).ok());  // 2 freed -> spare; 3 pinned
  ASSERT_TRUE(store.Publish(5, MakeVersion(layout, 5)).ok());  // 4 freed, spare taken by 5 then 4 -> spare
  s = store.stats();
  EXPECT_EQ(s.versions_in_memory, (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(s.spare_bytes, vb);
  pinned = Status::NotFound("released");  // 3 freed: a spare exists already
  s = store.stats();
  EXPECT_EQ(s.versions_in_memory, (std::vector<int64_t>{5}));
  EXPECT_EQ(s.bytes_held, 2 * vb);
  ExpectServing(store, 5);
}

// A version freed while a publish is staging (its pin dropped) is not kept as
// the spare: the staging already holds the place the spare has in the bound.
TEST(VersionStoreTest, ReuseBuffersKeepsTheBoundWhenAPinIsDroppedDuringStaging) {
  auto owned = MakeStore(SmallLayout(), 0, /*reuse_buffers=*/true);
  ASSERT_NE(owned, nullptr);
  VersionStore& store = *owned;
  const Layout layout = SmallLayout();
  const size_t vb = store.version_bytes();
  ASSERT_TRUE(store.Publish(1, MakeVersion(layout, 1)).ok());
  auto pinned = store.AcquireLatest();                         // 1
  ASSERT_TRUE(store.Publish(2, MakeVersion(layout, 2)).ok());  // 1 pinned
  ASSERT_TRUE(store.Publish(3, MakeVersion(layout, 3)).ok());  // 2 freed -> spare
  auto p = store.BeginPublish(4);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE((*p)->Put("w", MakeTensor(layout[0], 0, 4)).ok());  // the spare's buffers, both
  ASSERT_TRUE((*p)->Put("b", MakeTensor(layout[1], 1, 4)).ok());
  EXPECT_EQ(store.stats().spare_bytes, 0u);
  pinned = Status::NotFound("released");  // 1 freed while 4 is staging
  VersionStoreStats s = store.stats();
  EXPECT_EQ(s.versions_in_memory, (std::vector<int64_t>{3}));
  EXPECT_EQ(s.spare_bytes, 0u);
  EXPECT_EQ(s.bytes_held, 2 * vb);  // latest + staging
  EXPECT_LE(s.bytes_held, s.max_bytes_held);
  ASSERT_TRUE((*p)->Commit().ok());  // 3 freed -> spare
  s = store.stats();
  EXPECT_EQ(s.versions_in_memory, (std::vector<int64_t>{4}));
  EXPECT_EQ(s.bytes_held, 2 * vb);
  EXPECT_LE(s.bytes_held, s.max_bytes_held);
  ExpectServing(store, 4);
}

TEST(VersionStoreTest, PutAndCommitAfterCommitRefused) {
  auto store = MakeStore();
  const Layout layout = SmallLayout();
  auto p = store->BeginPublish(1);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE((*p)->Put("w", MakeTensor(layout[0], 0, 1)).ok());
  ASSERT_TRUE((*p)->Put("b", MakeTensor(layout[1], 1, 1)).ok());
  ASSERT_TRUE((*p)->Commit().ok());
  EXPECT_EQ((*p)->Put("w", MakeTensor(layout[0], 0, 1)).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*p)->Commit().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE((*p)->MutableStagedBytesForTesting("w").empty());
  p->reset();  // destroying a committed handle does not abort anything
  EXPECT_EQ(store->stats().aborts, 0u);
  ExpectServing(*store, 1);
}

TEST(VersionStoreTest, OversizedTensor) {
  VersionStoreOptions options;
  options.layout = {{"w", DType::kF32, {32}}};
  options.max_tensor_bytes = 128;
  auto store = VersionStore::Create(options);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  std::vector<float> small(32, 1.0f);
  ASSERT_TRUE((*store)->Publish(1, {{"w", HostTensor::Copy(DType::kF32, {32}, small.data(), 128)}}).ok());

  std::vector<float> big(64, 2.0f);
  Status s = (*store)->Publish(2, {{"w", HostTensor::Copy(DType::kF32, {64}, big.data(), 256)}});
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(s, "'w'") && Contains(s, "256 bytes") && Contains(s, "max_tensor_bytes=128")) << s.ToString();
  EXPECT_EQ((*store)->latest_version(), 1);
  EXPECT_EQ((*store)->stats().staging_version, kNoVersion);

  options.layout = {{"w", DType::kF32, {33}}};  // 132 bytes > 128
  auto too_big = VersionStore::Create(options);
  EXPECT_EQ(too_big.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(too_big.status(), "'w'") && Contains(too_big.status(), "max_tensor_bytes=128"));
}

TEST(VersionStoreTest, PublishWithExtraOrMissingTensorsLeavesServingVersion) {
  auto store = MakeStore();
  const Layout layout = SmallLayout();
  ASSERT_TRUE(store->Publish(1, MakeVersion(layout, 1)).ok());
  TensorMap extra = MakeVersion(layout, 2);
  extra["zzz"] = MakeTensor(layout[0], 0, 2);
  EXPECT_EQ(store->Publish(2, extra).code(), StatusCode::kInvalidArgument);
  TensorMap missing = MakeVersion(layout, 2);
  missing.erase("b");
  EXPECT_EQ(store->Publish(2, missing).code(), StatusCode::kFailedPrecondition);
  ExpectServing(*store, 1);
  EXPECT_EQ(store->stats().staging_bytes, 0u);
}

TEST(VersionStoreTest, CreateRejectsBadLayouts) {
  auto check = [](Layout layout, const std::string& needle) {
    VersionStoreOptions options;
    options.layout = std::move(layout);
    auto store = VersionStore::Create(options);
    EXPECT_EQ(store.status().code(), StatusCode::kInvalidArgument) << needle;
    EXPECT_TRUE(Contains(store.status(), needle)) << store.status().ToString();
  };
  check({}, "layout is empty");
  check({{"w", DType::kF32, {2}}, {"w", DType::kF32, {3}}}, "duplicate");
  check({{"w", DType::kF32, {2, -1}}}, "'w'");
  check({{"", DType::kF32, {2}}}, "empty name");
}

TEST(VersionStoreTest, MemoryBoundAndFreeOnUnpin) {
  auto store = MakeStore();
  const Layout layout = SmallLayout();
  const size_t vb = store->version_bytes();
  auto bounded = [&](const VersionStoreStats& s) {
    EXPECT_LE(s.versions_in_memory.size() + (s.staging_version != kNoVersion ? 1 : 0), s.max_versions_in_memory);
    EXPECT_LE(s.bytes_held, s.max_bytes_held);
    EXPECT_EQ(s.max_bytes_held, s.max_versions_in_memory * vb);
  };

  ASSERT_TRUE(store->Publish(1, MakeVersion(layout, 1)).ok());
  VersionHandle h1 = store->AcquireLatest().value();
  ASSERT_TRUE(store->Publish(2, MakeVersion(layout, 2)).ok());
  VersionHandle h2 = store->AcquireLatest().value();
  VersionHandle h2_copy = h2;  // a copy is one more pin
  for (int64_t v = 3; v <= 5; ++v) {
    ASSERT_TRUE(store->Publish(v, MakeVersion(layout, v)).ok());
    bounded(store->stats());
  }

  VersionStoreStats s = store->stats();
  EXPECT_EQ(s.latest_version, 5);
  ASSERT_EQ(s.pinned.size(), 2u);
  EXPECT_EQ(s.pinned[0].version, 1);
  EXPECT_EQ(s.pinned[0].pins, 1);
  EXPECT_EQ(s.pinned[1].version, 2);
  EXPECT_EQ(s.pinned[1].pins, 2);
  EXPECT_EQ(s.versions_in_memory, (std::vector<int64_t>{1, 2, 5}));  // 3 and 4 were freed unpinned
  EXPECT_EQ(s.bytes_held, 3 * vb);
  EXPECT_EQ(s.max_versions_in_memory, 4u);
  EXPECT_EQ(store->Acquire(3).status().code(), StatusCode::kNotFound);

  // Staging on top of the pinned versions stays inside the bound.
  {
    auto p = store->BeginPublish(6);
    ASSERT_TRUE(p.ok());
    ASSERT_TRUE((*p)->Put("w", MakeTensor(layout[0], 0, 6)).ok());
    ASSERT_TRUE((*p)->Put("b", MakeTensor(layout[1], 1, 6)).ok());
    s = store->stats();
    EXPECT_EQ(s.bytes_held, 4 * vb);
    bounded(s);
    ASSERT_TRUE((*p)->Commit().ok());
  }
  s = store->stats();
  EXPECT_EQ(s.versions_in_memory, (std::vector<int64_t>{1, 2, 6}));
  bounded(s);

  // Old versions are readable and intact while pinned, and freed when unpinned.
  EXPECT_EQ(CheckSnapshot(h1, layout), "");
  EXPECT_EQ(CheckSnapshot(h2, layout), "");
  h1 = VersionHandle();
  EXPECT_EQ(store->stats().versions_in_memory, (std::vector<int64_t>{2, 6}));
  h2 = VersionHandle();
  EXPECT_EQ(store->stats().versions_in_memory, (std::vector<int64_t>{2, 6}));  // h2_copy still pins
  h2_copy = VersionHandle();
  s = store->stats();
  EXPECT_EQ(s.versions_in_memory, (std::vector<int64_t>{6}));
  EXPECT_TRUE(s.pinned.empty());
  EXPECT_EQ(s.bytes_held, vb);
}

TEST(VersionStoreTest, TensorViewPinsItsVersion) {
  auto store = MakeStore();
  const Layout layout = SmallLayout();
  ASSERT_TRUE(store->Publish(1, MakeVersion(layout, 1)).ok());
  HostTensor view;
  {
    VersionHandle h = store->AcquireLatest().value();
    view = h.tensor("w").value();
  }
  ASSERT_TRUE(store->Publish(2, MakeVersion(layout, 2)).ok());
  VersionStoreStats s = store->stats();
  EXPECT_EQ(s.versions_in_memory, (std::vector<int64_t>{1, 2}));
  ASSERT_EQ(s.pinned.size(), 1u);
  EXPECT_EQ(s.pinned[0].version, 1);
  float first;
  std::memcpy(&first, view.data, sizeof(float));
  EXPECT_EQ(first, F32Value(1, 0));  // still version 1's bytes
  view = HostTensor();
  EXPECT_EQ(store->stats().versions_in_memory, (std::vector<int64_t>{2}));
}

TEST(VersionStoreTest, MaxPinnedVersionsIsAHardCap) {
  auto store = MakeStore(SmallLayout(), /*max_pinned=*/2);
  const Layout layout = SmallLayout();
  ASSERT_TRUE(store->Publish(1, MakeVersion(layout, 1)).ok());
  VersionHandle h1 = store->AcquireLatest().value();
  ASSERT_TRUE(store->Publish(2, MakeVersion(layout, 2)).ok());
  VersionHandle h2 = store->AcquireLatest().value();
  ASSERT_TRUE(store->Publish(3, MakeVersion(layout, 3)).ok());
  auto refused = store->AcquireLatest();
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(refused.status(), "version 3") && Contains(refused.status(), "max_pinned_versions=2"))
      << refused.status().ToString();
  VersionHandle h1_copy = h1;  // re-pinning a pinned version never fails
  EXPECT_TRUE(store->Acquire(1).ok());
  EXPECT_LE(store->stats().bytes_held, 4 * store->version_bytes());
  h1 = VersionHandle();
  h1_copy = VersionHandle();
  auto ok = store->AcquireLatest();
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->version(), 3);
}

TEST(VersionStoreTest, WaitForVersionWakesOnPublishAndTimesOut) {
  auto store = MakeStore();
  const Layout layout = SmallLayout();
  auto t0 = Clock::now();
  auto timeout = store->WaitForVersion(1, milliseconds(30));
  EXPECT_EQ(timeout.status().code(), StatusCode::kTimeout);
  EXPECT_TRUE(Contains(timeout.status(), ">= 1") && Contains(timeout.status(), "latest is -1"))
      << timeout.status().ToString();
  EXPECT_GE(Clock::now() - t0, milliseconds(30));

  std::thread publisher([&] {
    std::this_thread::sleep_for(milliseconds(50));
    EXPECT_TRUE(store->Publish(1, MakeVersion(layout, 1)).ok());
    std::this_thread::sleep_for(milliseconds(20));
    EXPECT_TRUE(store->Publish(2, MakeVersion(layout, 2)).ok());
  });
  t0 = Clock::now();
  auto got = store->WaitForVersion(2, milliseconds(5000));
  auto waited = Clock::now() - t0;
  publisher.join();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->version(), 2);
  EXPECT_EQ(CheckSnapshot(*got, layout), "");
  EXPECT_LT(waited, milliseconds(4000)) << "woken by the commit, not by the deadline";

  // Already satisfied: returns the latest at once.
  auto now = store->WaitForVersion(1, milliseconds(0));
  ASSERT_TRUE(now.ok());
  EXPECT_EQ(now->version(), 2);
}

TEST(VersionStoreTest, SubscribersNotifiedInOrderOnPublisherThread) {
  auto store = MakeStore();
  const Layout layout = SmallLayout();
  std::mutex mu;
  std::vector<int64_t> seen;
  std::vector<std::thread::id> threads;
  std::vector<Status> from_callback;
  uint64_t id = store->Subscribe([&](int64_t v) {
    // A callback may acquire the version it is told about...
    auto h = store->Acquire(v);
    // ...but must not publish.
    auto p = store->BeginPublish(v + 1000);
    std::lock_guard<std::mutex> lock(mu);
    seen.push_back(v);
    threads.push_back(std::this_thread::get_id());
    from_callback.push_back(h.ok() ? p.status() : h.status());
  });
  std::thread::id publisher_id;
  std::thread publisher([&] {
    publisher_id = std::this_thread::get_id();
    for (int64_t v = 1; v <= 30; ++v) EXPECT_TRUE(store->Publish(v, MakeVersion(layout, v)).ok());
  });
  publisher.join();
  ASSERT_TRUE(store->Unsubscribe(id).ok());
  EXPECT_EQ(store->Unsubscribe(id).code(), StatusCode::kNotFound);
  ASSERT_TRUE(store->Publish(31, MakeVersion(layout, 31)).ok());

  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(seen.size(), 30u);
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i], static_cast<int64_t>(i) + 1);
    EXPECT_EQ(threads[i], publisher_id);
    EXPECT_EQ(from_callback[i].code(), StatusCode::kFailedPrecondition) << from_callback[i].ToString();
  }
}

TEST(VersionStoreTest, UnsubscribeFromInsideCallback) {
  auto store = MakeStore();
  const Layout layout = SmallLayout();
  std::atomic<int> calls{0};
  uint64_t id = 0;
  id = store->Subscribe([&](int64_t) {
    ++calls;
    EXPECT_TRUE(store->Unsubscribe(id).ok());
  });
  ASSERT_TRUE(store->Publish(1, MakeVersion(layout, 1)).ok());
  ASSERT_TRUE(store->Publish(2, MakeVersion(layout, 2)).ok());
  EXPECT_EQ(calls.load(), 1);
}

// One publisher, four readers pinning at random moments: every snapshot a
// reader sees is entirely one version with valid checksums, versions seen by a
// reader never go backwards, and memory stays inside the documented bound.
TEST(VersionStoreTest, NoTornReadsUnderStress) {
  const Layout layout = {{"w", DType::kF32, {16, 64}}, {"b", DType::kI64, {128}}, {"n", DType::kF32, {100}}};
  auto store = MakeStore(layout);
  constexpr int64_t kVersions = 200;
  constexpr int kReaders = 4;
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  std::atomic<bool> done{false};
  std::mutex errors_mu;
  std::vector<std::string> errors;
  auto fail = [&](std::string e) {
    std::lock_guard<std::mutex> lock(errors_mu);
    if (errors.size() < 20) errors.push_back(std::move(e));
  };
  auto check_bound = [&](const char* where) {
    VersionStoreStats s = store->stats();
    size_t in_memory = s.versions_in_memory.size() + (s.staging_version != kNoVersion ? 1 : 0);
    if (in_memory > s.max_versions_in_memory || s.bytes_held > s.max_bytes_held) {
      fail(std::string(where) + ": " + std::to_string(in_memory) + " versions / " + std::to_string(s.bytes_held) +
           " bytes over the bound " + std::to_string(s.max_versions_in_memory) + " / " +
           std::to_string(s.max_bytes_held));
    }
  };

  std::vector<int64_t> reads(kReaders, 0);
  std::vector<std::vector<int64_t>> seen(kReaders);  // distinct versions, per reader
  std::atomic<int64_t> held_across_publish{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < kReaders; ++r) {
    readers.emplace_back([&, r] {
      std::mt19937 rng(1234 + r);  // explicit seeds
      int64_t last = kNoVersion;
      while (Clock::now() < deadline) {
        const bool finished = done.load();
        auto h = store->AcquireLatest();
        if (!h.ok()) {
          if (h.status().code() != StatusCode::kNotFound) fail(h.status().ToString());
          std::this_thread::yield();
          continue;
        }
        if (h->version() < last)
          fail("reader went backwards: " + std::to_string(last) + " -> " + std::to_string(h->version()));
        if (h->version() != last) seen[r].push_back(h->version());
        last = h->version();
        if (std::string e = CheckSnapshot(*h, layout); !e.empty()) fail("torn read: " + e);
        if (Status s = h->Verify(); !s.ok()) fail(s.ToString());
        ++reads[r];
        // Sometimes hold the pin across later publishes and re-check: the
        // pinned snapshot must not change under the reader.
        if (rng() % 4 == 0) {
          std::this_thread::sleep_for(std::chrono::microseconds(rng() % 500));
          if (std::string e = CheckSnapshot(*h, layout); !e.empty()) fail("pinned snapshot changed: " + e);
          if (store->latest_version() > h->version()) ++held_across_publish;
          check_bound("reader");
        }
        if (finished) break;  // one full pass after the last publish
      }
    });
  }

  int64_t published = 0;
  for (int64_t v = 1; v <= kVersions && Clock::now() < deadline; ++v) {
    if (v % 2 == 0) {
      ASSERT_TRUE(store->Publish(v, MakeVersion(layout, v)).ok());
    } else {  // two-phase, checking the bound while staging
      auto p = store->BeginPublish(v);
      ASSERT_TRUE(p.ok()) << p.status().ToString();
      for (const auto& [name, t] : MakeVersion(layout, v)) {
        ASSERT_TRUE((*p)->Put(name, t).ok());
        check_bound("staging");
      }
      ASSERT_TRUE((*p)->Commit().ok());
    }
    check_bound("publisher");
    published = v;
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // let readers in between versions
  }
  done = true;
  for (auto& t : readers) t.join();

  for (const auto& e : errors) ADD_FAILURE() << e;
  EXPECT_GE(published, 50) << "publisher starved";
  size_t distinct = 0;
  for (int r = 0; r < kReaders; ++r) {
    EXPECT_GT(reads[r], 0) << "reader " << r;
    distinct += seen[r].size();
  }
  // The test only means something if readers overlapped many publishes.
  EXPECT_GE(distinct, 10u);
  EXPECT_GE(held_across_publish.load(), 1);
  VersionStoreStats s = store->stats();
  EXPECT_EQ(s.latest_version, published);
  EXPECT_TRUE(s.pinned.empty());
  EXPECT_EQ(s.versions_in_memory, (std::vector<int64_t>{published}));
  EXPECT_EQ(s.bytes_held, store->version_bytes());
  EXPECT_EQ(s.commits, static_cast<uint64_t>(published));
}

}  // namespace
}  // namespace sluice::checkpoint_engine
