#include "sluice/schedule/packing.h"

#include <gtest/gtest.h>

namespace sluice::schedule {
namespace {

TEST(PackingTest, GroupsSimilarLengthsUnderTheBudget) {
  const std::vector<int64_t> lengths = {10, 50, 12, 48, 11};
  const std::vector<size_t> order = {0, 1, 2, 3, 4};
  const auto mbs = PackMicroBatches(lengths, order, 100, 1);
  // By length: 10, 11, 12 (3 x 12 = 36), then 48 (4 x 48 > 100): 48, 50.
  ASSERT_EQ(mbs.size(), 2u);
  EXPECT_EQ(mbs[0], (std::vector<size_t>{0, 4, 2}));
  EXPECT_EQ(mbs[1], (std::vector<size_t>{3, 1}));
  EXPECT_EQ(PaddedTokens(lengths, mbs[1]), 100);
}

TEST(PackingTest, SplitsForParallelWorkers) {
  const std::vector<int64_t> lengths(8, 10);
  std::vector<size_t> order;
  for (size_t i = 0; i < 8; ++i) order.push_back(i);
  EXPECT_EQ(PackMicroBatches(lengths, order, 1000, 1).size(), 1u);
  // Two workers: about two micro-batches each (share = 80 / 4 = 20 tokens).
  EXPECT_EQ(PackMicroBatches(lengths, order, 1000, 2).size(), 4u);
  // Never below the longest sample.
  EXPECT_EQ(PackMicroBatches(lengths, order, 1000, 64).size(), 8u);
}

TEST(PackingTest, PacksOnlyTheSamplesOrderNames) {
  const std::vector<int64_t> lengths = {5, 6, 7, 8};
  const auto mbs = PackMicroBatches(lengths, {3, 1}, 100, 1);
  ASSERT_EQ(mbs.size(), 1u);
  EXPECT_EQ(mbs[0], (std::vector<size_t>{1, 3}));
}

}  // namespace
}  // namespace sluice::schedule
