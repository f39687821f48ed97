#include "ranks_store.h"

#include <unistd.h>

#include <algorithm>
#include <string>

#include "sluice/common/logging.h"
#include "sluice/common/metrics_server.h"
#include "sluice/common/socket_util.h"
#include "stream_roles.h"

namespace sluice::pipeline {

using std::chrono::milliseconds;

// The trace part and supervisor name of a role's process: "trainer",
// "rollout", "reward" for the first, "trainer-1", "rollout-2", ... after.
std::string ProcessName(PipelineRole role, int64_t index) {
  return index == 0 ? PipelineRoleName(role) : PipelineRoleName(role) + "-" + std::to_string(index);
}
// A hub storage rank's (cluster.storage_ranks), for its heartbeat's key.
std::string HubStorageProcessName(int64_t index) { return "hub-storage-" + std::to_string(index); }

// Where the trainer ranks' keys live in their store (a torchrun restart
// attempt's own namespace when a launcher placed the ranks).
std::string StoreKeys(const PipelineOptions& po) {
  return po.wiring.trainer_store_prefix.empty() ? trainer::DataParallelOptions{}.key_prefix
                                                : po.wiring.trainer_store_prefix;
}

// Who holds the hub leases a role process takes (GetMetaRequest::holder):
// its name and pid, so a restarted process's are not its predecessor's.
std::string LeaseHolder(const std::string& process_name, pid_t pid) { return process_name + "/" + std::to_string(pid); }

// Logs what releasing a dead process's hub leases did (`quiet_if_none`:
// nothing when it held none).
void LogReleased(const std::string& name, pid_t pid, const Result<transfer_queue::ReleaseHolderResponse>& released,
                 bool quiet_if_none) {
  if (!released.ok()) {
    SLUICE_LOG(WARNING) << name << " (pid " << pid
                        << ") is gone; releasing its hub leases: " << released.status().ToString();
  } else if (released->leases_released > 0 || !quiet_if_none) {
    SLUICE_LOG(WARNING) << name << " (pid " << pid << ") is gone: released its " << released->leases_released
                        << " hub lease(s), " << released->rows_returned << " row(s) ready again";
  }
}

// A client of the ranks' store at "HOST:PORT", under `prefix` (a malformed
// address is named with `what`).
Result<std::unique_ptr<trainer::DataParallelStore>> ConnectRanksStore(const std::string& at,
                                                                      std::chrono::milliseconds wait,
                                                                      const std::string& prefix,
                                                                      const std::string& what) {
  std::string host;
  int port = 0;
  SLUICE_RETURN_IF_ERROR(ParseListenAddress(at, &host, &port).WithContext(what));
  return trainer::DataParallelStore::Connect(host, port, wait, prefix);
}

// kRanksEndedKey's value: "ok", or "failed: " and why.
std::string RunEndedValue(const Status& outcome) {
  return outcome.ok() ? "ok" : "failed: " + outcome.ToString().substr(0, 400);
}

// What a process elsewhere makes of that value (from the network: anything
// but "ok" is a failure).
Status RunEndedOutcome(const std::string& value) {
  if (value == "ok") return Status::Ok();
  const std::string why =
      value.rfind("failed: ", 0) == 0 ? value.substr(8, 400) : "an unreadable end ('" + value.substr(0, 40) + "')";
  return Status::Aborted("rank 0's run failed: " + why);
}

// How long rank 0's launcher may be silent in the ranks' store before the
// processes elsewhere take it for dead.
std::chrono::seconds LauncherSilenceLimit(const PipelineOptions& po) {
  return std::chrono::seconds(std::clamp<int64_t>(po.rank_timeout_seconds, 1, 60));
}

// This host's name, for the names a process on another host goes by.
std::string HostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == 0) return "unknown-host";
  return name;
}

LauncherLife::LauncherLife(std::chrono::seconds limit) : limit_(limit) {}

Status LauncherLife::Check(trainer::DataParallelStore& store) {
  const auto now = std::chrono::steady_clock::now();
  if (now < next_look_) return Status::Ok();
  next_look_ = now + std::chrono::seconds(1);
  Result<std::string> beat = store.GetShared(kLauncherBeatKey, milliseconds(0));
  if (!beat.ok() && beat.status().code() != StatusCode::kTimeout) {
    return Status::Unavailable("rank 0's store is gone (" + beat.status().message() + "): rank 0 died");
  }
  if (beat.ok() && *beat != last_) last_ = *beat, since_ = now;
  if (now - since_ > limit_) {
    return Status::Unavailable("rank 0's launcher gave no sign of life in the ranks' store for " +
                               std::to_string(limit_.count()) + " s: it died or hangs");
  }
  return Status::Ok();
}

std::optional<Status> LauncherLife::Ended(trainer::DataParallelStore& store, milliseconds wait) {
  Result<std::string> said = store.GetShared(kRanksEndedKey, wait);
  if (said.ok()) return RunEndedOutcome(*said);
  if (Status alive = Check(store); !alive.ok()) return alive;
  return std::nullopt;
}

}  // namespace sluice::pipeline
