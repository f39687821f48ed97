// The launcher's watchdog: the stall watch over the run health's
// heartbeats (pipeline.stall_seconds), and what /proc says a process is
// doing, for its reports.
#ifndef SLUICE_SRC_PIPELINE_WATCHDOG_H_
#define SLUICE_SRC_PIPELINE_WATCHDOG_H_

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "sluice/common/status.h"
#include "sluice/pipeline/options.h"
#include "sluice/pipeline/run_health.h"

namespace sluice::pipeline {

// What /proc says process `pid` is doing, in words for the stall report.
std::string DescribeProcessState(pid_t pid);

// The launcher's watchdog (pipeline.stall_seconds): called on every poll of
// the supervisor, it reports each role whose heartbeat in the run health is older
// than the limit, once per stall, and says when it moves again. Before its
// first turn a role is starting (exec, libtorch, the model, the hub and the
// weight store): that gets at least pipeline.stall_start_seconds. With stop_on_stall the first stall ends the
// run with Timeout naming the role.
//
// Thread safety: none; the launcher's supervision loop owns it.
class StallWatch {
 public:
  struct Role {
    std::string name;  // the supervisor's
    std::string what;  // in reports: "the rollout role", "trainer rank 1", "rollout replica 2"
    int slot;          // in the run health
    pid_t pid = -1;
    std::chrono::steady_clock::time_point started{};
    // A process on another host: its host's name once it reported (its
    // heartbeat reaches the run health through the ranks' store, RemoteBeats).
    bool remote = false;
    std::string host{};
  };
  // `pid_of`: a role process's pid now (-1 while it waits to be restarted):
  // a restarted one starts its watch afresh.
  StallWatch(RunHealth& health, std::vector<Role> roles, const PipelineOptions& po,
             std::function<pid_t(const std::string&)> pid_of);

  // Reports each stall once, and when the role moves again; Timeout naming
  // every silent role with pipeline.stop_on_stall.
  Status Check();
  // One more process to watch (one that joined the run), from now.
  void Add(Role r);
  // A remote process's host, once known (for the reports).
  void SetHost(const std::string& name, const std::string& host, pid_t pid);

 private:
  // "in 'decode step' for 312 s": what the role last said it does.
  std::string DescribeActivity(const Role& r, std::chrono::steady_clock::time_point now) const;

  RunHealth& health_;
  std::vector<Role> roles_;
  const std::chrono::seconds limit_;
  const std::chrono::seconds start_allowance_;
  const bool stop_;
  const std::function<pid_t(const std::string&)> pid_of_;
  std::vector<bool> reported_;
};

}  // namespace sluice::pipeline

#endif  // SLUICE_SRC_PIPELINE_WATCHDOG_H_
