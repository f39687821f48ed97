#include "net/open_writes.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace sluice::transfer_queue::internal {
namespace {

using namespace std::chrono_literals;
using testing::I64;
using TimePoint = OpenWrites::TimePoint;

BeginWriteRequest Declared() {
  BeginWriteRequest r;
  r.columns = {{"prompt", {TensorMeta{DType::kI64, {1}, 8}, TensorMeta{DType::kI64, {2}, 16}}}};
  return r;
}

TEST(OpenWritesTest, StoreChecksCellsAndCommitForgets) {
  OpenWrites writes(1000ms, 2);
  const TimePoint t0 = TimePoint(1h);
  writes.Add(7, Declared(), {10, 11}, t0);
  int stored = 0;
  auto store = [&] {
    ++stored;
    return Status::Ok();
  };
  StorageWriteRequest ok{7, {{10, "prompt", I64({5})}}};
  TQ_EXPECT_OK(writes.Store(ok, 0, store, t0));
  StorageWriteRequest wrong_shape{7, {{11, "prompt", I64({5})}}};
  TQ_EXPECT_ERROR(writes.Store(wrong_shape, 1, store, t0), kInvalidArgument, "differs from the declared");
  StorageWriteRequest wrong_unit{7, {{11, "prompt", I64({5, 6})}}};
  TQ_EXPECT_ERROR(writes.Store(wrong_unit, 0, store, t0), kInvalidArgument, "belongs to storage unit 1");
  EXPECT_EQ(stored, 1);
  TQ_EXPECT_OK(writes.Commit(
      7, [] { return Status::Ok(); }, t0));
  EXPECT_EQ(writes.size(), 0u);
  TQ_EXPECT_ERROR(writes.Store(ok, 0, store, t0), kNotFound, "not open");
  TQ_EXPECT_ERROR(writes.Commit(
                      7, [] { return Status::Ok(); }, t0),
                  kNotFound, "not open");
}

TEST(OpenWritesTest, FailedCommitStaysOpenAndAbortHandsOverCells) {
  OpenWrites writes(1000ms, 2);
  const TimePoint t0 = TimePoint(1h);
  writes.Add(7, Declared(), {10, 11}, t0);
  TQ_EXPECT_ERROR(writes.Commit(
                      7, [] { return Status::NotFound("row cleared"); }, t0),
                  kNotFound, "row cleared");
  EXPECT_EQ(writes.size(), 1u);
  auto discardable = writes.Discardable(StorageDiscardRequest{{10, 12}, {"prompt", "reward"}});
  ASSERT_EQ(discardable.size(), 1u);
  EXPECT_EQ(discardable[0].first, 10u);
  EXPECT_EQ(discardable[0].second, std::vector<std::string>{"prompt"});
  std::vector<RowId> discarded;
  TQ_EXPECT_OK(writes.Abort(7, [&](const WriteCells* cells) {
    EXPECT_NE(cells, nullptr);
    if (cells) discarded = cells->rows;
    return Status::Ok();
  }));
  EXPECT_EQ(discarded, (std::vector<RowId>{10, 11}));
  TQ_EXPECT_OK(writes.Abort(7, [&](const WriteCells* cells) {
    EXPECT_EQ(cells, nullptr);  // unknown now: the controller answers
    return Status::Ok();
  }));
  EXPECT_TRUE(writes.Discardable(StorageDiscardRequest{{10}, {"prompt"}}).empty());
}

TEST(OpenWritesTest, ExpiryAfterIdleTimeoutOnly) {
  OpenWrites writes(1000ms, 2);
  const TimePoint t0 = TimePoint(1h);
  writes.Add(7, Declared(), {10, 11}, t0);
  writes.Add(8, Declared(), {12, 13}, t0);
  // Activity on 8 pushes its deadline.
  StorageWriteRequest store{8, {{12, "prompt", I64({5})}}};
  TQ_EXPECT_OK(writes.Store(
      store, 0, [] { return Status::Ok(); }, t0 + 800ms));
  std::vector<WriteId> expired;
  auto collect = [&](WriteId id, const WriteCells&) { expired.push_back(id); };
  EXPECT_EQ(writes.Expire(t0 + 900ms, collect), 0u);
  EXPECT_EQ(writes.Expire(t0 + 1100ms, collect), 1u);
  EXPECT_EQ(expired, std::vector<WriteId>{7});
  EXPECT_EQ(writes.Expire(t0 + 1900ms, collect), 1u);
  EXPECT_EQ(expired, (std::vector<WriteId>{7, 8}));
  // Never with timeout 0.
  OpenWrites forever(0ms, 1);
  forever.Add(1, Declared(), {1, 2}, t0);
  EXPECT_EQ(forever.Expire(t0 + 24h, collect), 0u);
}

}  // namespace
}  // namespace sluice::transfer_queue::internal
