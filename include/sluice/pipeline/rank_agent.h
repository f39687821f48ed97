// The launched processes of a run that are not roles: a hub storage rank,
// and a torchrun restart attempt's wait for the attempt before it. (The
// role processes on other hosts run through TrainingRun: RunLaunchedRank,
// SuperviseLaunchedRank, ClaimJoinedIndex.) Both meet rank 0's launcher in
// the ranks' store (options.pipeline.wiring.trainer_store).
//
// Thread safety: each call is one process's main loop.
#ifndef SLUICE_PIPELINE_RANK_AGENT_H_
#define SLUICE_PIPELINE_RANK_AGENT_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "sluice/common/status.h"
#include "sluice/pipeline/options.h"
#include "sluice/pipeline/roles.h"
#include "sluice/pipeline/run.h"

namespace sluice::pipeline {

// A process above rank 0 that a launcher (torchrun, Slurm, Open MPI)
// started, on any host, beside rank 0's `sluice train` (which runs the
// hub, the reward, trainer rank 0 and the rollout replicas of its host):
// trainer rank `index` (above 0), or rollout replica `index`
// (cluster.rollout_ranks; its weights over the CheckpointEngine
// broadcast). Waits up to `wait` in the ranks' store at `store`
// (HOST:PORT) for rank 0's run, checks that it has this process's config
// (run.options().pipeline.wiring.config_digest; FailedPrecondition naming
// both otherwise), then runs its role in `run` (created with that config)
// until the run ends (the hub over TCP). `joined`: a process that joins
// the run beyond the launch (`sluice train --join`, index from
// ClaimJoinedIndex): a config that differs refuses this process only, and
// a rollout replica needs a run that relays weights to other hosts
// (cluster.rollout_ranks > 0).
Status RunLaunchedRank(TrainingRun& run, const std::string& store, PipelineRole role, int64_t index,
                       std::chrono::milliseconds wait, bool joined = false);
// The same rollout replica or reward worker with pipeline.max_restarts:
// this process is its host's supervisor. It checks the run as above, then
// runs `command` (with `child_env` on top of its environment: the same
// process again, told to run the role itself) as a child and starts it
// again when it fails or dies, up to max_restarts times (back-off 1, 2,
// 4, ... 30 s), giving the dead child's hub leases back at once.
Status SuperviseLaunchedRank(const PipelineOptions& options, const std::string& store, PipelineRole role, int64_t index,
                             std::chrono::milliseconds wait, const std::vector<std::string>& command,
                             const std::map<std::string, std::string>& child_env, bool joined = false);
// A rollout replica or reward worker joining a launched run beyond the
// processes the launch declared: numbers it after them (and after those
// that joined before) through a counter in the ranks' store at `store`.
// OutOfRange past RunHealth's 64 replicas / workers.
Result<int64_t> ClaimJoinedIndex(const PipelineOptions& options, const std::string& store, PipelineRole role,
                                 std::chrono::milliseconds wait);

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
