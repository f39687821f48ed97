#include "core/lease_table.h"

#include <gtest/gtest.h>

namespace sluice::transfer_queue::internal {
namespace {

using std::chrono::milliseconds;

TEST(LeaseTableTest, GrantsUniqueIdsAndExpiresInDeadlineOrder) {
  LeaseTable table(16);
  const Clock::TimePoint t0{std::chrono::hours(1)};
  const LeaseId a = table.Grant(0, "train", {1, 2}, "", t0, t0 + milliseconds(30)).id;
  const LeaseId b = table.Grant(0, "train", {3}, "", t0, t0 + milliseconds(10)).id;
  const LeaseId c = table.Grant(1, "reward", {4}, "", t0, t0 + milliseconds(20)).id;
  EXPECT_EQ(a, 1u);
  EXPECT_EQ(b, 2u);
  EXPECT_EQ(c, 3u);
  EXPECT_EQ(*table.NextDeadline(), t0 + milliseconds(10));
  EXPECT_TRUE(table.TakeExpired(t0 + milliseconds(9)).empty());
  auto expired = table.TakeExpired(t0 + milliseconds(20));
  ASSERT_EQ(expired.size(), 2u);
  EXPECT_EQ(expired[0].id, b);
  EXPECT_EQ(expired[1].id, c);
  EXPECT_EQ(table.active(), 1u);
  EXPECT_EQ(table.Find(b), nullptr);
  ASSERT_NE(table.Find(a), nullptr);
  EXPECT_EQ(table.Find(a)->rows, (std::vector<RowId>{1, 2}));
}

TEST(LeaseTableTest, ExplainsWhyALeaseIsNotActive) {
  LeaseTable table(16);
  const Clock::TimePoint t0{std::chrono::hours(1)};
  const LeaseId acked = table.Grant(0, "train", {1}, "", t0, t0 + milliseconds(50)).id;
  const LeaseId released = table.Grant(0, "train", {2}, "", t0, t0 + milliseconds(50)).id;
  const LeaseId expired = table.Grant(0, "train", {3}, "", t0, t0 + milliseconds(5)).id;
  table.End(acked, LeaseEnd::kAcked, t0);
  table.End(released, LeaseEnd::kReleased, t0);
  ASSERT_EQ(table.TakeExpired(t0 + milliseconds(6)).size(), 1u);

  Status s = table.NotActive(expired, "ack", t0 + milliseconds(8));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("lease 3 expired at 3600.005s"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("3.0 ms ago"), std::string::npos) << s.ToString();
  s = table.NotActive(acked, "ack", t0);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("already acked"), std::string::npos) << s.ToString();
  s = table.NotActive(released, "release", t0);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("released"), std::string::npos) << s.ToString();
  s = table.NotActive(99, "ack", t0);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("never granted"), std::string::npos) << s.ToString();
}

TEST(LeaseTableTest, HistoryIsBounded) {
  LeaseTable table(2);
  const Clock::TimePoint t0{std::chrono::hours(1)};
  for (int i = 0; i < 3; ++i) {
    const LeaseId id = table.Grant(0, "t", {RowId(i)}, "", t0, t0 + milliseconds(1)).id;
    table.End(id, LeaseEnd::kAcked, t0);
  }
  EXPECT_EQ(table.NotActive(1, "ack", t0).code(), StatusCode::kNotFound) << "forgotten";
  EXPECT_NE(table.NotActive(1, "ack", t0).message().find("too long ago"), std::string::npos);
  EXPECT_EQ(table.NotActive(2, "ack", t0).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(table.NotActive(3, "ack", t0).code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace sluice::transfer_queue::internal
