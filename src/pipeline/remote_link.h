// What a role process on another host tells rank 0's launcher, through the
// ranks' store (the c10d TCPStore of the run's rendezvous), and how the
// launcher takes it in:
//
//   process elsewhere (its link thread, once a second)     rank 0's launcher (RemoteBeats)
//     "beat/<process>": heartbeat, activity, counters  ──►  its slot in the run health (the watchdog,
//       (tokens, decode time, reward errors), clock          the live counters, the
//                                                            trainer's step records)
//     "trace/<process>/<pid>/<n>": its trace, whole    ──►  roles/trace-<process>.jsonl
//       lines, a chunk at a time (run.trace)                 (checked, on rank 0's clock)
//
// Everything read from the store is checked: a malformed report or line is
// left out and logged, never trusted.
#ifndef SLUICE_PIPELINE_REMOTE_LINK_H_
#define SLUICE_PIPELINE_REMOTE_LINK_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "sluice/common/status.h"
#include "sluice/pipeline/roles.h"
#include "sluice/pipeline/run_health.h"
#include "sluice/trainer/data_parallel.h"

namespace sluice::pipeline {

std::string RemoteBeatKey(const std::string& process_name);

// A process's report: its own run health's `slot` (heartbeat and activity as
// ages, since the hosts' steady clocks differ), its counters, its clock
// (TraceClockOffsetUs), pid and host. `seq` grows with each report;
// kFinalReport is the last (`failed`: the role returned an error).
inline constexpr int64_t kFinalReport = INT64_MAX;
std::string EncodeRemoteBeat(const RunHealth& health, int slot, int64_t seq, pid_t pid, const std::string& host,
                             bool failed = false);

// A process's counters so far (its own run health's totals).
struct RemoteCounters {
  int64_t tokens = 0, busy_us = 0, slot_steps = 0, active_slot_steps = 0, reward_errors = 0;
};

struct RemoteBeat {
  int64_t seq = 0, beat_age_ms = -1, activity_age_ms = -1;
  bool finished = false, failed = false;
  uint32_t activity = 0;
  int64_t pid = 0;
  std::string host;
  int64_t clock_us = 0;
  RemoteCounters counters;
};
// A report from the network: anything malformed or out of range is refused whole (DataLoss).
Result<RemoteBeat> DecodeRemoteBeat(const std::string& text);

// The process side of the trace: sends what the process's recorder flushed
// to `path` (its trace part on its host) since the last call, whole lines
// only, as chunks under "trace/<process>/<pid>/<n>". Each call sends at
// most `max_chunks` chunks (0: all there is). A chunk the store refused is
// sent again next time.
class TraceShipper {
 public:
  TraceShipper(std::string path, const std::string& process_name, pid_t pid);
  void Ship(trainer::DataParallelStore& store, int max_chunks);
  static constexpr size_t kChunkBytes = size_t{1} << 20;

 private:
  std::string path_, key_prefix_;
  uint64_t offset_ = 0;
  int64_t next_ = 0;
};

// Rank 0's side: mirrors each process's reports onto its slot (the
// watchdog reads them as it reads the local ones; a report that stops
// changing leaves the heartbeat where it was, and it ages), adds the
// counters' growth to the run health's (a rollout replica's to its own too),
// and with `trace_part` set appends each process's trace to the path it
// names for the process, on this host's clock.
class RemoteBeats {
 public:
  struct Options {
    // A process's first report, and its first after a restart: its pid and host.
    std::function<void(const std::string& name, const std::string& host, pid_t pid)> on_new_life;
    // run.trace: where a process's trace goes (empty: not traced).
    std::function<std::string(const std::string& name)> trace_part;
  };
  explicit RemoteBeats(Options options) : options_(std::move(options)) {}
  // A process to hear from, mirrored onto slot `slot`; a rollout
  // replica's counters go to its replica's too (`rollout_replica` >= 0).
  void Add(const std::string& name, int slot, int64_t rollout_replica = -1);
  bool empty() const { return processes_.empty(); }

  // Reads the reports, once a second (`now`: at once).
  void Poll(trainer::DataParallelStore& store, RunHealth& health, bool now = false);
  // At the run's end, once the ranks' store says it ended: waits up to
  // `timeout` for the last report (and trace) of every process heard from
  // in the last few seconds.
  void Finish(trainer::DataParallelStore& store, RunHealth& health, std::chrono::milliseconds timeout);

  // What the processes elsewhere added to the run health's counters so far.
  int64_t tokens() const { return added_.tokens; }
  int64_t reward_errors() const { return added_.reward_errors; }

  // Bytes of trace kept per process (more is dropped, and logged).
  static constexpr int64_t kMaxTraceBytes = int64_t{512} << 20;

 private:
  struct Process {
    std::string name;
    int slot;
    int64_t rollout_replica;  // -1: not a rollout replica
    int64_t tid_base;
    int64_t seq = 0, pid = 0, clock_us = 0;
    RemoteCounters seen{};
    bool warned = false, final = false;
    std::chrono::steady_clock::time_point heard{};  // when its report last changed
    int64_t next_chunk = 0, trace_bytes = 0, rejected_lines = 0;
    bool trace_warned = false;
  };
  // Appends what `p` sent of its trace (up to kChunksPerPoll chunks);
  // true if it may have sent more.
  bool TakeTrace(trainer::DataParallelStore& store, Process& p);

  Options options_;
  std::vector<Process> processes_;
  RemoteCounters added_{};
  std::chrono::steady_clock::time_point next_poll_{};
};

}  // namespace sluice::pipeline

#endif  // SLUICE_PIPELINE_REMOTE_LINK_H_
