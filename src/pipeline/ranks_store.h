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

// Keys in the trainer ranks' store (pipeline.trainer_ranks > 1), besides
// each step's plan: what rank 0's launcher tells ranks launched elsewhere
// (JSON: hub, token, start_step, start_version, config_digest), that the
// run has ended and how ("ok" or "failed: <why>", set however it ends; the
// ranks then stop waiting, and exit as the run did), and rank 0's
// launcher's beat (a counter it sets once a second while it runs), and
// that the launcher has let go of the attempt (its hub stopped, its
// processes ended: a torchrun agent may start the next attempt's rank 0).
inline constexpr char kRanksRunInfoKey[] = "run";
inline constexpr char kRanksEndedKey[] = "ended";
inline constexpr char kLauncherBeatKey[] = "launcher/beat";
inline constexpr char kLauncherExitedKey[] = "launcher/exited";
// Set by a launched rank that refuses the run (why): rank 0's launcher then
// stops the run instead of waiting for it.
inline constexpr char kRanksRefusedKey[] = "refused";
// Counters of the processes that joined the run beyond the launch
// (`sluice train --join`), by role: "joined/rollout", "joined/reward".
inline constexpr char kRanksJoinedPrefix[] = "joined/";
// Hub storage units on other hosts (cluster.storage_ranks): rank 0's plan
// (JSON: token, peer_token, units, config_digest), each storage rank's
// endpoint ("hub_storage/<index>"), and that rank 0's hub has stopped.
inline constexpr char kHubStoragePlanKey[] = "hub_storage/plan";
inline constexpr char kHubStoragePrefix[] = "hub_storage/";
inline constexpr char kHubStoppedKey[] = "hub_storage/stopped";

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
