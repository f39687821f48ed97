// What the processes of a launched run share besides the hub and the
// weights: the names they go by (in the trace, the supervisor and the hub's
// leases) and the ranks' store, through which rank 0's launcher publishes
// the run and says it lives and how it ended (stream_launch.cc is rank 0's
// side, rank_agent.cc the other ranks').
//
// Thread safety: pure functions; a LauncherLife is one thread's.
#ifndef SLUICE_SRC_PIPELINE_RANKS_STORE_H_
#define SLUICE_SRC_PIPELINE_RANKS_STORE_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "sluice/common/status.h"
#include "sluice/pipeline/options.h"
#include "sluice/pipeline/roles.h"
#include "sluice/trainer/data_parallel.h"
#include "sluice/transfer_queue/controller.h"

namespace sluice::pipeline {

// The trace part and supervisor name of a role's process: "trainer",
// "rollout", "reward" for the first, "trainer-1", "rollout-2", ... after.
std::string ProcessName(PipelineRole role, int64_t index);
// A hub storage rank's (cluster.storage_ranks), for its heartbeat's key.
std::string HubStorageProcessName(int64_t index);
// Where the trainer ranks' keys live in their store (a torchrun restart
// attempt's own namespace when a launcher placed the ranks).
std::string StoreKeys(const PipelineOptions& po);
// Who holds the hub leases a role process takes (GetMetaRequest::holder):
// its name and pid, so a restarted process's are not its predecessor's.
std::string LeaseHolder(const std::string& process_name, pid_t pid);
// This host's name, for the names a process on another host goes by.
std::string HostName();

// Logs what releasing a dead process's hub leases did (`quiet_if_none`:
// nothing when it held none).
void LogReleased(const std::string& name, pid_t pid, const Result<transfer_queue::ReleaseHolderResponse>& released,
                 bool quiet_if_none);

// A client of the ranks' store at "HOST:PORT", under `prefix` (a malformed
// address is named with `what`).
Result<std::unique_ptr<trainer::DataParallelStore>> ConnectRanksStore(const std::string& at,
                                                                      std::chrono::milliseconds wait,
                                                                      const std::string& prefix,
                                                                      const std::string& what = "the ranks' store");

// kRanksEndedKey's value: "ok", or "failed: " and why.
std::string RunEndedValue(const Status& outcome);
// What a process elsewhere makes of that value (from the network: anything
// but "ok" is a failure).
Status RunEndedOutcome(const std::string& value);

// How long rank 0's launcher may be silent in the ranks' store before the
// processes elsewhere take it for dead.
std::chrono::seconds LauncherSilenceLimit(const PipelineOptions& po);

// Whether rank 0's launcher lives, from the beat it sets in the ranks' store
// once a second (kLauncherBeatKey): one that has not moved for the limit,
// or a store that is gone, means it died.
class LauncherLife {
 public:
  explicit LauncherLife(std::chrono::seconds limit);
  // Reads the beat at most once a second.
  Status Check(trainer::DataParallelStore& store);
  // How the attempt under the store's prefix ended: nothing while it runs,
  // its outcome once rank 0 said it (waiting up to `wait`), Unavailable
  // once rank 0 is gone.
  std::optional<Status> Ended(trainer::DataParallelStore& store,
                              std::chrono::milliseconds wait = std::chrono::milliseconds(0));

 private:
  std::chrono::seconds limit_;
  std::string last_;
  std::chrono::steady_clock::time_point since_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point next_look_{};
};

}  // namespace sluice::pipeline

#endif  // SLUICE_SRC_PIPELINE_RANKS_STORE_H_
