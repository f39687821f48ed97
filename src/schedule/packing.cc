#include "sluice/schedule/packing.h"

#include <algorithm>

namespace sluice::schedule {

std::vector<std::vector<size_t>> PackMicroBatches(const std::vector<int64_t>& lengths, const std::vector<size_t>& order,
                                                  int64_t budget, int32_t threads) {
  std::vector<size_t> by_length = order;
  std::stable_sort(by_length.begin(), by_length.end(), [&](size_t a, size_t b) { return lengths[a] < lengths[b]; });
  int64_t pack_budget = budget;
  if (threads > 1) {
    int64_t total = 0, longest_sample = 0;
    for (size_t i : order) total += lengths[i], longest_sample = std::max(longest_sample, lengths[i]);
    const int64_t share = (total + 2 * threads - 1) / (2 * threads);
    pack_budget = std::max(longest_sample, std::min(budget, share));
  }
  std::vector<std::vector<size_t>> groups;
  int64_t longest = 0;
  for (size_t i : by_length) {
    const int64_t len = lengths[i];
    const int64_t grown = std::max(longest, len);
    if (groups.empty() || static_cast<int64_t>(groups.back().size() + 1) * grown > pack_budget) {
      groups.emplace_back();
      longest = len;
    } else {
      longest = grown;
    }
    groups.back().push_back(i);
  }
  return groups;
}

int64_t PaddedTokens(const std::vector<int64_t>& lengths, const std::vector<size_t>& micro_batch) {
  int64_t longest = 0;
  for (size_t i : micro_batch) longest = std::max(longest, lengths[i]);
  return longest * static_cast<int64_t>(micro_batch.size());
}

}  // namespace sluice::schedule
