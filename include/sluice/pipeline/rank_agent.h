// The launched processes of a run that are not roles: a hub storage rank,
// and a torchrun restart attempt's wait for the attempt before it. (The
// role processes on other hosts run through TrainingRun: RunLaunchedRank,
// SuperviseLaunchedRank, ClaimJoinedIndex.) Both meet rank 0's launcher in
// the ranks' store (options.pipeline.wiring.trainer_store).
//
// Thread safety: each call is one process's main loop.
#ifndef SLUICE_PIPELINE_RANK_AGENT_H_
#define SLUICE_PIPELINE_RANK_AGENT_H_

#include <cstdint>
#include <string>

#include "sluice/common/status.h"
#include "sluice/pipeline/options.h"

namespace sluice::pipeline {

// A launched process serving one of the hub's storage units
// (cluster.storage_ranks; unit 1 + `index`, unit 0 being on rank 0's host):
// takes rank 0's plan from the ranks' store (options.pipeline.wiring.trainer_store;
// its config must match, FailedPrecondition otherwise), starts a
// TransferQueue storage server on this host's address toward the
// rendezvous, tells rank 0 where, and serves until rank 0's hub has
// stopped. `placed` says how it was launched, for its first line.
Status ServeHubStorage(const RunOptions& options, int64_t index, const std::string& placed);

// A launched process of a torchrun restart attempt (options.
// previous_store_prefix set), before it meets rank 0: waits until rank 0's
// launcher has ended the attempt before (said how in the ranks' store, or
// is gone), however long that attempt still runs, so that its wait for
// this attempt's rank 0 (pipeline.rank_timeout_seconds) starts when rank 0
// does. Returns true when that attempt finished the run (nothing is left
// to do), false to go on; Unavailable when the store cannot be reached.
Result<bool> AwaitPreviousAttempt(const PipelineOptions& options);

}  // namespace sluice::pipeline

#endif  // SLUICE_PIPELINE_RANK_AGENT_H_
