// How a trainer step's samples are split into micro-batches: the policy the
// trainer runs and the simulator replays (docs/simulator.md), torch-free.
//
// Thread safety: pure functions.
#ifndef SLUICE_SCHEDULE_PACKING_H_
#define SLUICE_SCHEDULE_PACKING_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace sluice::schedule {

// Packs the samples `order` names (indices into `lengths`, each sample's
// prompt + response tokens, all in 1..budget) into micro-batches. Greedy by
// length (stable, so deterministic): similar lengths share a micro-batch and
// little compute goes to padding; a micro-batch grows while
// rows x longest <= the packing budget. With `threads` > 1 workers the
// budget shrinks to about two micro-batches per worker (at least the longest
// sample), so a batch that would fit one micro-batch still splits and a
// worker that finishes early takes another. Returns the micro-batches as
// indices into `lengths`, in the order they are computed.
// Preconditions (the caller validated them): every length in 1..budget,
// threads >= 1.
std::vector<std::vector<size_t>> PackMicroBatches(const std::vector<int64_t>& lengths, const std::vector<size_t>& order,
                                                  int64_t budget, int32_t threads);

// The padded tokens of a micro-batch: rows x its longest sample.
int64_t PaddedTokens(const std::vector<int64_t>& lengths, const std::vector<size_t>& micro_batch);

}  // namespace sluice::schedule

#endif  // SLUICE_SCHEDULE_PACKING_H_
