#include "sluice/transfer_queue/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "sluice/common/random.h"

namespace sluice::transfer_queue {
namespace {

std::vector<int64_t> RankSums(const std::vector<int64_t>& lengths, const std::vector<uint32_t>& rank, uint32_t n) {
  std::vector<int64_t> sums(n, 0);
  for (size_t i = 0; i < lengths.size(); ++i) sums[rank[i]] += lengths[i];
  return sums;
}

// The best possible largest rank sum, by exhaustive search (small inputs).
int64_t OptimalMax(const std::vector<int64_t>& lengths, uint32_t n) {
  std::vector<uint32_t> assign(lengths.size(), 0);
  int64_t best = std::numeric_limits<int64_t>::max();
  while (true) {
    auto sums = RankSums(lengths, assign, n);
    best = std::min(best, *std::max_element(sums.begin(), sums.end()));
    size_t i = 0;
    while (i < assign.size() && ++assign[i] == n) assign[i++] = 0;
    if (i == assign.size()) break;
  }
  return best;
}

TEST(BalanceByLengthTest, GreedyLargestFirstBalancesSums) {
  auto ranks = BalanceByLength({10, 1, 7, 3, 5, 5, 2, 8}, 2);
  ASSERT_TRUE(ranks.ok()) << ranks.status().ToString();
  auto sums = RankSums({10, 1, 7, 3, 5, 5, 2, 8}, *ranks, 2);
  EXPECT_EQ(sums[0], 21);
  EXPECT_EQ(sums[1], 20);
  // Deterministic.
  EXPECT_EQ(*ranks, *BalanceByLength({10, 1, 7, 3, 5, 5, 2, 8}, 2));
}

TEST(BalanceByLengthTest, EqualLengthsSpreadEvenly) {
  auto ranks = BalanceByLength(std::vector<int64_t>(8, 0), 4);
  ASSERT_TRUE(ranks.ok());
  std::vector<int> count(4, 0);
  for (uint32_t r : *ranks) ++count[r];
  EXPECT_EQ(count, (std::vector<int>{2, 2, 2, 2})) << "ties go to the rank with fewer items";
}

TEST(BalanceByLengthTest, WithinTheLptBoundOfOptimal) {
  for (uint64_t seed = 0; seed < 40; ++seed) {
    const uint32_t n = 2 + seed % 3;
    std::vector<int64_t> lengths(6 + seed % 3);
    for (size_t i = 0; i < lengths.size(); ++i) lengths[i] = 1 + SplitMix64(HashCombine(seed, i)) % 100;
    auto ranks = BalanceByLength(lengths, n);
    ASSERT_TRUE(ranks.ok());
    auto sums = RankSums(lengths, *ranks, n);
    const int64_t got = *std::max_element(sums.begin(), sums.end());
    const int64_t opt = OptimalMax(lengths, n);
    EXPECT_LE(3 * got, 4 * opt) << "seed " << seed;
    const int64_t total = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
    EXPECT_LE(got, total / n + *std::max_element(lengths.begin(), lengths.end())) << "seed " << seed;
  }
}

TEST(BalanceByLengthTest, RejectsBadInput) {
  EXPECT_EQ(BalanceByLength({1, 2}, 0).status().code(), StatusCode::kInvalidArgument);
  auto bad = BalanceByLength({1, -2}, 2);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("item 1"), std::string::npos);
  EXPECT_TRUE(BalanceByLength({}, 3)->empty());
}

}  // namespace
}  // namespace sluice::transfer_queue
