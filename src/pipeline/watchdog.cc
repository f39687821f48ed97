// The launcher's watchdog; see watchdog.h.
#include "watchdog.h"

#include <algorithm>
#include <utility>

#include "sluice/common/logging.h"
#include "sluice/common/shm.h"

namespace sluice::pipeline {

// What /proc says a process is doing, in words for the stall report.
std::string DescribeProcessState(pid_t pid) {
  Result<char> state = ReadProcessState(pid);
  if (!state.ok()) return "state unknown";
  switch (*state) {
    case 'R':
      return "running (state R): computing without reaching the end of a loop turn";
    case 'S':
      return "sleeping (state S): blocked on a lock, a pipe or a sleep";
    case 'D':
      return "waiting on the kernel (state D): disk or page-fault I/O";
    case 'T':
      return "stopped by a signal (state T): `kill -CONT " + std::to_string(pid) + "` resumes it";
    case 't':
      return "stopped by a debugger (state t)";
    default:
      return std::string("state ") + *state;
  }
}

StallWatch::StallWatch(RunHealth& health, std::vector<Role> roles, const PipelineOptions& po,
                       std::function<pid_t(const std::string&)> pid_of)
    : health_(health),
      roles_(std::move(roles)),
      limit_(std::chrono::seconds(po.stall_seconds)),
      start_allowance_(std::chrono::seconds(po.stall_start_seconds)),
      stop_(po.stop_on_stall),
      pid_of_(std::move(pid_of)),
      reported_(roles_.size(), false) {
  for (Role& r : roles_) r.started = std::chrono::steady_clock::now();
}

Status StallWatch::Check() {
  const auto now = std::chrono::steady_clock::now();
  for (Role& r : roles_) {
    const pid_t pid = pid_of_(r.name);
    if (r.remote || pid == r.pid || pid < 0) continue;
    // A new life: it starts again, from nothing said.
    r.pid = pid;
    r.started = now;
    health_.Restart(r.slot);
  }
  if (limit_.count() == 0) return Status::Ok();
  // Each role's silence; reports of those past their limit.
  std::vector<std::pair<std::chrono::seconds, std::string>> quiet_roles;  // (quiet, report), for a stop
  bool stop_now = false;
  for (size_t i = 0; i < roles_.size(); ++i) {
    const Role& r = roles_[i];
    if (!r.remote && pid_of_(r.name) < 0) continue;  // waiting to be started again
    const int64_t beat = health_.Slot(r.slot).beat_ns;
    if (beat == SlotHealth::kFinished) continue;
    const auto last = beat == 0 ? r.started : std::chrono::steady_clock::time_point(std::chrono::nanoseconds(beat));
    const auto quiet = std::chrono::duration_cast<std::chrono::seconds>(now - last);
    const std::chrono::seconds limit = beat == 0 ? std::max(limit_, start_allowance_) : limit_;
    const std::string who = r.what + (!r.remote        ? " (pid " + std::to_string(r.pid) + ")"
                                      : r.host.empty() ? " (on another host, not heard from yet)"
                                                       : " (pid " + std::to_string(r.pid) + " on host " + r.host + ")");
    const std::string state =
        r.remote ? "on another host: its heartbeat comes through the ranks' store" : DescribeProcessState(r.pid);
    const std::string what = who + " has made no progress for " + std::to_string(quiet.count()) + " s (" +
                             (beat == 0 ? "since it started, " : "") +
                             "pipeline.stall_seconds=" + std::to_string(limit_.count()) +
                             "): " + DescribeActivity(r, now) + "; it is " + state;
    if (quiet.count() >= 1) quiet_roles.emplace_back(quiet, what);
    if (quiet < limit) {
      if (reported_[i]) SLUICE_LOG(INFO) << who << " makes progress again";
      reported_[i] = false;
      continue;
    }
    if (reported_[i]) continue;
    reported_[i] = true;
    if (stop_) {
      stop_now = true;
      continue;
    }
    SLUICE_LOG(WARNING) << what << "; the run waits for it (pipeline.stop_on_stall=true stops the run instead)";
  }
  if (!stop_now) return Status::Ok();
  // Every silent role, the longest silent first: one stuck trainer rank
  // leaves the others waiting in a collective, and the cause is among them.
  std::stable_sort(quiet_roles.begin(), quiet_roles.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string report;
  for (const auto& [quiet, what] : quiet_roles) report += (report.empty() ? "" : "; ") + what;
  return Status::Timeout(report + "; stopping the run (pipeline.stop_on_stall=true)");
}

std::string StallWatch::DescribeActivity(const Role& r, std::chrono::steady_clock::time_point now) const {
  const int64_t since = health_.Slot(r.slot).activity_since_ns;
  const std::string name = health_.DescribeActivity(r.slot);
  const auto from = since == 0 ? r.started : std::chrono::steady_clock::time_point(std::chrono::nanoseconds(since));
  return "in '" + name + "' for " +
         std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now - from).count()) + " s";
}

void StallWatch::Add(Role r) {
  r.started = std::chrono::steady_clock::now();
  roles_.push_back(std::move(r));
  reported_.push_back(false);
}

void StallWatch::SetHost(const std::string& name, const std::string& host, pid_t pid) {
  for (Role& r : roles_) {
    if (r.name == name) r.host = host, r.pid = pid;
  }
}
}  // namespace sluice::pipeline
