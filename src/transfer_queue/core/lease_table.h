// LeaseTable: the active leases of the controller, ordered by deadline for
// expiry, plus a bounded memory of ended leases so that a late Ack learns
// *why* its lease is gone ("expired at ...") instead of "unknown lease".
//
// Costs: Grant/End O(log L); TakeExpired O((e + 1) log L) for e expired
// leases; NextDeadline O(1). History is a FIFO of `history` entries.
//
// Thread safety: none; guarded by the controller's mutex.
#ifndef SLUICE_SRC_TRANSFER_QUEUE_LEASE_TABLE_H_
#define SLUICE_SRC_TRANSFER_QUEUE_LEASE_TABLE_H_

#include <deque>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "sluice/common/status.h"
#include "sluice/transfer_queue/clock.h"
#include "sluice/transfer_queue/types.h"

namespace sluice::transfer_queue::internal {

struct LeaseRecord {
  LeaseId id = 0;
  uint32_t task = 0;
  std::string task_name;
  std::vector<RowId> rows;
  std::string holder;  // GetMetaRequest::holder
  Clock::TimePoint granted;
  Clock::TimePoint deadline;
};

enum class LeaseEnd : uint8_t { kAcked, kReleased, kExpired };

class LeaseTable {
 public:
  explicit LeaseTable(size_t history) : history_(history) {}

  // Registers a new lease; ids start at 1 and are never reused.
  const LeaseRecord& Grant(uint32_t task, std::string task_name, std::vector<RowId> rows, std::string holder,
                           Clock::TimePoint now, Clock::TimePoint deadline);
  // Null if `id` is not active.
  const LeaseRecord* Find(LeaseId id) const;
  // The active leases of `holder`, in grant order.
  std::vector<LeaseId> HeldBy(std::string_view holder) const;
  // Moves an active lease's deadline. Precondition: active.
  const LeaseRecord& SetDeadline(LeaseId id, Clock::TimePoint deadline);
  // Removes an active lease and remembers how it ended. Precondition: active.
  LeaseRecord End(LeaseId id, LeaseEnd how, Clock::TimePoint when);
  // Ends (as expired, at their deadlines) and returns the active leases whose
  // deadline is <= now, earliest first.
  std::vector<LeaseRecord> TakeExpired(Clock::TimePoint now);
  std::optional<Clock::TimePoint> NextDeadline() const;
  size_t active() const { return active_.size(); }

  // Why `id` is not active, for `op` ("ack", "release"): FailedPrecondition
  // naming how and when it ended, or NotFound if it was never granted or has
  // left the history.
  Status NotActive(LeaseId id, std::string_view op, Clock::TimePoint now) const;

 private:
  struct Ended {
    LeaseEnd how;
    Clock::TimePoint when;
    std::string task_name;
  };

  const size_t history_;
  LeaseId next_id_ = 1;
  std::unordered_map<LeaseId, LeaseRecord> active_;
  std::set<std::pair<Clock::TimePoint, LeaseId>> by_deadline_;
  std::unordered_map<LeaseId, Ended> ended_;
  std::deque<LeaseId> ended_order_;
};

}  // namespace sluice::transfer_queue::internal

#endif  // SLUICE_SRC_TRANSFER_QUEUE_LEASE_TABLE_H_
