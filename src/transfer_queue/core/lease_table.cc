#include "core/lease_table.h"

#include <algorithm>
#include <cstdio>

#include "core/validation.h"
#include "sluice/common/check.h"

namespace sluice::transfer_queue::internal {
namespace {

// Seconds on the controller clock, e.g. "3600.250s".
std::string ClockString(Clock::TimePoint t) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.3fs", std::chrono::duration<double>(t.time_since_epoch()).count());
  return buf;
}

std::string AgoString(Clock::TimePoint then, Clock::TimePoint now) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.1f ms ago", std::chrono::duration<double, std::milli>(now - then).count());
  return buf;
}

}  // namespace

const LeaseRecord& LeaseTable::Grant(uint32_t task, std::string task_name, std::vector<RowId> rows, std::string holder,
                                     Clock::TimePoint now, Clock::TimePoint deadline) {
  LeaseRecord record;
  record.id = next_id_++;
  record.task = task;
  record.task_name = std::move(task_name);
  record.rows = std::move(rows);
  record.holder = std::move(holder);
  record.granted = now;
  record.deadline = deadline;
  by_deadline_.emplace(deadline, record.id);
  auto [it, inserted] = active_.emplace(record.id, std::move(record));
  SLUICE_CHECK(inserted);
  return it->second;
}

const LeaseRecord* LeaseTable::Find(LeaseId id) const {
  auto it = active_.find(id);
  return it == active_.end() ? nullptr : &it->second;
}

std::vector<LeaseId> LeaseTable::HeldBy(std::string_view holder) const {
  std::vector<LeaseId> out;
  for (const auto& [id, lease] : active_) {
    if (lease.holder == holder) out.push_back(id);
  }
  std::sort(out.begin(), out.end());  // ids grow with every grant
  return out;
}

const LeaseRecord& LeaseTable::SetDeadline(LeaseId id, Clock::TimePoint deadline) {
  auto it = active_.find(id);
  SLUICE_CHECK(it != active_.end()) << "renewing lease " << id << " which is not active";
  by_deadline_.erase({it->second.deadline, id});
  it->second.deadline = deadline;
  by_deadline_.emplace(deadline, id);
  return it->second;
}

LeaseRecord LeaseTable::End(LeaseId id, LeaseEnd how, Clock::TimePoint when) {
  auto it = active_.find(id);
  SLUICE_CHECK(it != active_.end()) << "ending lease " << id << " which is not active";
  LeaseRecord record = std::move(it->second);
  active_.erase(it);
  by_deadline_.erase({record.deadline, id});
  if (history_ > 0) {
    if (ended_order_.size() >= history_) {
      ended_.erase(ended_order_.front());
      ended_order_.pop_front();
    }
    ended_.emplace(id, Ended{how, when, record.task_name});
    ended_order_.push_back(id);
  }
  return record;
}

std::vector<LeaseRecord> LeaseTable::TakeExpired(Clock::TimePoint now) {
  std::vector<LeaseRecord> out;
  while (!by_deadline_.empty() && by_deadline_.begin()->first <= now) {
    auto [deadline, id] = *by_deadline_.begin();
    out.push_back(End(id, LeaseEnd::kExpired, deadline));
  }
  return out;
}

std::optional<Clock::TimePoint> LeaseTable::NextDeadline() const {
  if (by_deadline_.empty()) return std::nullopt;
  return by_deadline_.begin()->first;
}

Status LeaseTable::NotActive(LeaseId id, std::string_view op, Clock::TimePoint now) const {
  const std::string what = "cannot " + std::string(op) + " lease " + std::to_string(id);
  auto it = ended_.find(id);
  if (it == ended_.end()) {
    if (id == 0 || id >= next_id_) return Status::NotFound(what + ": it was never granted");
    return Status::NotFound(what + ": it ended too long ago to be remembered");
  }
  const Ended& e = it->second;
  const std::string task = " (task " + Quoted(e.task_name) + ")";
  switch (e.how) {
    case LeaseEnd::kExpired:
      return Status::FailedPrecondition(what + task + ": lease " + std::to_string(id) + " expired at " +
                                        ClockString(e.when) + " on the controller clock (" + AgoString(e.when, now) +
                                        "); its rows were returned to ready and may be delivered again");
    case LeaseEnd::kAcked:
      return Status::FailedPrecondition(what + task + ": it was already acked " + AgoString(e.when, now));
    case LeaseEnd::kReleased:
      return Status::FailedPrecondition(what + task + ": it was released " + AgoString(e.when, now) +
                                        "; its rows were returned to ready");
  }
  return Status::Internal(what + ": unknown lease end");
}

}  // namespace sluice::transfer_queue::internal
