// Token-balanced assignment of a batch to data-parallel ranks.
//
// Thread safety: pure functions.
#ifndef SLUICE_TRANSFER_QUEUE_SAMPLING_H_
#define SLUICE_TRANSFER_QUEUE_SAMPLING_H_

#include <cstdint>
#include <vector>

#include "sluice/common/status.h"

namespace sluice::transfer_queue {

// Assigns each item (a row or a whole group, weighing `lengths[i]` tokens) to
// one of `num_ranks` ranks so that the per-rank sums are balanced: items in
// decreasing length (ties: lower index first) each go to the rank with the
// smallest sum so far (ties: fewer items, then lower rank). Deterministic. The
// largest rank sum is at most 4/3 of the best possible (the LPT bound) and at
// most the mean rank sum plus the longest item. Returns the rank of each item.
// Errors: InvalidArgument if num_ranks == 0 or a length is negative.
Result<std::vector<uint32_t>> BalanceByLength(const std::vector<int64_t>& lengths, uint32_t num_ranks);

}  // namespace sluice::transfer_queue

#endif  // SLUICE_TRANSFER_QUEUE_SAMPLING_H_
