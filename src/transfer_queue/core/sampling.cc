#include "sluice/transfer_queue/sampling.h"

#include <algorithm>
#include <numeric>
#include <string>

namespace sluice::transfer_queue {

Result<std::vector<uint32_t>> BalanceByLength(const std::vector<int64_t>& lengths, uint32_t num_ranks) {
  if (num_ranks == 0) return Status::InvalidArgument("BalanceByLength: num_ranks must be > 0");
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (lengths[i] < 0) {
      return Status::InvalidArgument("BalanceByLength: item " + std::to_string(i) + " has negative length " +
                                     std::to_string(lengths[i]));
    }
  }
  std::vector<size_t> order(lengths.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return lengths[a] > lengths[b]; });
  std::vector<int64_t> sum(num_ranks, 0);
  std::vector<size_t> count(num_ranks, 0);
  std::vector<uint32_t> rank(lengths.size(), 0);
  for (size_t item : order) {
    // Least-loaded rank; ties to the one with fewer items, then the lower
    // index. num_ranks is small (data-parallel width), so a linear scan
    // beats a heap here.
    uint32_t best = 0;
    for (uint32_t r = 1; r < num_ranks; ++r) {
      if (sum[r] < sum[best] || (sum[r] == sum[best] && count[r] < count[best])) best = r;
    }
    rank[item] = best;
    sum[best] += lengths[item];
    ++count[best];
  }
  return rank;
}

}  // namespace sluice::transfer_queue
