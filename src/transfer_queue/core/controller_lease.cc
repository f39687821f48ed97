// GetMeta, Ack, Release, Renew and lease expiry of the in-process controller.
//
// Expiry is lazy: every call first returns the rows of leases past their
// deadline to ready, and a GetMeta that has to wait wakes up at the earliest
// lease deadline to do the same. So expired rows are redelivered to the
// first consumer that asks for them, with no background thread.
#include <algorithm>
#include <chrono>
#include <utility>

#include "core/in_process_controller.h"
#include "core/validation.h"
#include "sluice/common/check.h"
#include "sluice/transfer_queue/sampling.h"

namespace sluice::transfer_queue::internal {

size_t InProcessController::ExpireLocked() {
  std::vector<LeaseRecord> expired = leases_.TakeExpired(clock_->Now());
  for (const LeaseRecord& lease : expired) {
    auto [returned, cleared] = ReturnRowsLocked(lease);
    ++counters_.leases_expired;
    counters_.rows_redelivered += returned;
  }
  if (!expired.empty()) SignalReadyLocked();
  return expired.size();
}

std::pair<uint64_t, uint64_t> InProcessController::ReturnRowsLocked(const LeaseRecord& lease) {
  std::vector<Row*> rows;
  uint64_t cleared = 0;
  for (RowId id : lease.rows) {
    auto it = rows_.find(id);
    if (it == rows_.end()) {
      ++cleared;
      continue;
    }
    Row& row = it->second;
    SLUICE_CHECK(row.state(lease.task) == Consumption::kLeased && row.slot(lease.task).lease == lease.id)
        << "row " << id << " of lease " << lease.id << " is not leased by it";
    rows.push_back(&row);
  }
  MutateRowsLocked(rows, [&](Row& row) SLUICE_REQUIRES(mu_) {
    CountRowLocked(row, -1);
    row.slot(lease.task) = TaskSlot{};
    CountRowLocked(row, +1);
  });
  return {rows.size(), cleared};
}

Result<BatchMeta> InProcessController::GetMeta(const GetMetaRequest& request) {
  const SamplingPolicy& policy = request.policy;
  const bool whole_group = policy.mode == SamplingMode::kWholeGroup;
  std::string what = "GetMeta(task " + Quoted(request.task) + ", partition " + Quoted(request.partition) +
                     ", n=" + std::to_string(request.n) + ")";
  SLUICE_RETURN_IF_ERROR(ValidateName("task", request.task));
  SLUICE_RETURN_IF_ERROR(ValidateName("partition", request.partition));
  if (request.columns.empty()) return Status::InvalidArgument(what + ": no columns requested");
  if (request.n == 0) return Status::InvalidArgument(what + ": n must be > 0");
  if (request.n > options_.max_batch_rows) {
    return Status::OutOfRange(what + ": n exceeds max_batch_rows=" + std::to_string(options_.max_batch_rows));
  }
  if (request.n > options_.capacity_rows) {
    return Status::OutOfRange(what + ": n exceeds capacity_rows=" + std::to_string(options_.capacity_rows) +
                              "; it could never be served");
  }
  SLUICE_RETURN_IF_ERROR(ValidateTimeout(request.timeout, what + ": timeout"));
  SLUICE_RETURN_IF_ERROR(ValidateTimeout(request.lease_timeout, what + ": lease_timeout"));
  if (request.lease_timeout > kMaxLeaseTimeout) {
    return Status::OutOfRange(what + ": lease_timeout " + std::to_string(request.lease_timeout.count()) +
                              " ms exceeds the 7-day maximum");
  }
  if (policy.min_policy_version > policy.max_policy_version) {
    return Status::InvalidArgument(what + ": min_policy_version " + std::to_string(policy.min_policy_version) +
                                   " > max_policy_version " + std::to_string(policy.max_policy_version));
  }
  if (policy.dp_ranks == 0) return Status::InvalidArgument(what + ": dp_ranks must be >= 1");
  if (request.holder.size() > kMaxNameBytes) {
    return Status::InvalidArgument(what + ": holder is " + std::to_string(request.holder.size()) + " bytes, at most " +
                                   std::to_string(kMaxNameBytes) + " allowed");
  }

  MutexLock lock(&mu_);
  SLUICE_RETURN_IF_ERROR(CheckOpenLocked());
  ExpireLocked();
  SLUICE_ASSIGN_OR_RETURN(const uint32_t task, FindTaskLocked(request.task));
  Result<uint64_t> mask_or = ColumnMaskLocked(request.columns);
  if (!mask_or.ok()) return mask_or.status().WithContext(what);
  const uint64_t mask = *mask_or;
  SLUICE_ASSIGN_OR_RETURN(Partition * partition, FindPartitionLocked(request.partition));
  if (!partition->Consumes(task)) {
    return Status::InvalidArgument(what + ": task " + Quoted(request.task) + " does not consume partition " +
                                   Quoted(partition->id) + " (not among the consumers it was created with)");
  }

  uint32_t group_size = 0;
  if (whole_group) {
    group_size = policy.group_size;
    if (partition->group_size != 0) {
      if (group_size != 0 && group_size != partition->group_size) {
        return Status::InvalidArgument(what + ": group size mismatch: the request asks for groups of " +
                                       std::to_string(group_size) + ", partition " + Quoted(partition->id) +
                                       " declares " + std::to_string(partition->group_size));
      }
      group_size = partition->group_size;
    }
    if (group_size == 0) {
      return Status::InvalidArgument(what + ": whole-group sampling needs a group size: declare it on partition " +
                                     Quoted(partition->id) + " or set policy.group_size");
    }
    if (request.n % group_size != 0) {
      return Status::InvalidArgument(what + ": n is not a multiple of the group size " + std::to_string(group_size));
    }
  }
  const uint32_t units = whole_group ? request.n / group_size : request.n;
  if (policy.dp_ranks > units) {
    return Status::InvalidArgument(what + ": dp_ranks " + std::to_string(policy.dp_ranks) + " > " +
                                   std::to_string(units) + (whole_group ? " groups" : " rows") +
                                   " would leave ranks empty");
  }
  const uint64_t incarnation = partition->incarnation;
  SLUICE_ASSIGN_OR_RETURN(ReadyView * view, ViewLocked(*partition, task, mask));

  // Wait until the view can serve the request.
  const auto deadline = DeadlineAfter(request.timeout);
  std::vector<RowId> picked_rows;
  std::vector<GroupId> picked_groups;
  while (true) {
    // (again after every wait: a waiting holder may have been released)
    SLUICE_RETURN_IF_ERROR(CheckNotFencedLocked(request.holder, what));
    if (whole_group) {
      picked_groups = view->PickGroups(units, group_size, policy.min_policy_version, policy.max_policy_version);
      if (picked_groups.size() == units) break;
    } else {
      picked_rows = view->PickRows(units, policy.min_policy_version, policy.max_policy_version);
      if (picked_rows.size() == units) break;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      return Status::Timeout(what + ": only " +
                             (whole_group
                                  ? std::to_string(picked_groups.size()) + " of " + std::to_string(units) +
                                        " groups of " + std::to_string(group_size)
                                  : std::to_string(picked_rows.size()) + " of " + std::to_string(units) + " rows") +
                             " eligible after " + std::to_string(request.timeout.count()) + " ms");
    }
    auto wake = deadline;
    if (auto next = leases_.NextDeadline()) {
      // Lease deadlines are on the controller clock; waits are in real time.
      const auto until = std::max(*next - clock_->Now(), Clock::TimePoint::duration::zero());
      wake = std::min(wake, now + until + std::chrono::milliseconds(1));
    }
    const uint64_t seen = ready_epoch_;
    ++waiting_consumers_;
    ++task_depth_[task].waiting;
    ready_cv_.WaitUntil(&mu_, wake, [&]() SLUICE_REQUIRES(mu_) { return closed_ || ready_epoch_ != seen; });
    --task_depth_[task].waiting;
    --waiting_consumers_;
    SLUICE_RETURN_IF_ERROR(CheckOpenLocked());
    ExpireLocked();
    auto it = partitions_.find(request.partition);
    if (it == partitions_.end() || it->second->incarnation != incarnation) {
      return Status::NotFound(what + ": partition " + Quoted(request.partition) + " was cleared while waiting");
    }
  }

  // Rows in batch order; for whole groups, group after group, each by row id.
  std::vector<Row*> rows;
  std::vector<uint32_t> unit_of_row;
  if (whole_group) {
    for (uint32_t g = 0; g < picked_groups.size(); ++g) {
      for (RowId id : partition->groups.at(picked_groups[g]).rows) {
        rows.push_back(&rows_.at(id));
        unit_of_row.push_back(g);
      }
    }
  } else {
    for (uint32_t i = 0; i < picked_rows.size(); ++i) {
      rows.push_back(&rows_.at(picked_rows[i]));
      unit_of_row.push_back(i);
    }
  }
  SLUICE_CHECK_EQ(rows.size(), request.n);

  const Clock::TimePoint now = clock_->Now();
  const auto lease_timeout = request.lease_timeout.count() > 0 ? request.lease_timeout : options_.default_lease_timeout;
  std::vector<RowId> ids;
  for (Row* row : rows) ids.push_back(row->id);
  const LeaseRecord& lease = leases_.Grant(task, tasks_[task], ids, request.holder, now, now + lease_timeout);
  MutateRowsLocked(rows, [&](Row& row) SLUICE_REQUIRES(mu_) {
    CountRowLocked(row, -1);
    row.slot(task) = TaskSlot{Consumption::kLeased, lease.id};
    CountRowLocked(row, +1);
  });
  ++counters_.leases_granted;

  BatchMeta meta;
  meta.lease_id = lease.id;
  meta.task = request.task;
  meta.partition = request.partition;
  meta.columns = ColumnNamesLocked(mask);
  meta.deadline = lease.deadline;
  meta.dp_ranks = policy.dp_ranks;
  for (Row* row : rows) meta.rows.push_back(RowMeta{row->id, row->tags});
  if (policy.dp_ranks > 1) {
    std::vector<int64_t> weights(units, 0);
    for (size_t i = 0; i < rows.size(); ++i) weights[unit_of_row[i]] += rows[i]->tags.token_length;
    SLUICE_ASSIGN_OR_RETURN(std::vector<uint32_t> unit_rank, BalanceByLength(weights, policy.dp_ranks));
    for (size_t i = 0; i < rows.size(); ++i) meta.rank.push_back(unit_rank[unit_of_row[i]]);
  }
  return meta;
}

Result<AckResponse> InProcessController::Ack(const AckRequest& request) {
  const LeaseId id = request.lease_id;
  MutexLock lock(&mu_);
  SLUICE_RETURN_IF_ERROR(CheckOpenLocked());
  ExpireLocked();
  const Clock::TimePoint now = clock_->Now();
  if (leases_.Find(id) == nullptr) return leases_.NotActive(id, "ack", now);
  const LeaseRecord lease = leases_.End(id, LeaseEnd::kAcked, now);
  AckResponse out;
  std::vector<Row*> done;
  std::vector<std::pair<RowId, GroupId>> logged;
  std::string partition;
  for (RowId row_id : lease.rows) {
    auto it = rows_.find(row_id);
    if (it == rows_.end()) {
      ++out.rows_cleared;
      continue;
    }
    Row& row = it->second;
    if (ack_log_) {
      logged.emplace_back(row_id, row.tags.group_id);
      partition = row.partition->id;
    }
    SLUICE_CHECK(row.state(lease.task) == Consumption::kLeased && row.slot(lease.task).lease == id)
        << "row " << row_id << " of lease " << id << " is not leased by it";
    // kLeased -> kAcked: the row is in none of this task's views before or
    // after, and other tasks' views do not depend on it, so no reindexing.
    CountRowLocked(row, -1);
    row.slot(lease.task) = TaskSlot{Consumption::kAcked, 0};
    ++row.acked;
    CountRowLocked(row, +1);
    ++task_depth_[lease.task].acked_total;
    ++out.rows_acked;
    const size_t consumers = row.partition->all_tasks ? tasks_.size() : row.partition->consumers.size();
    if (row.acked == consumers) done.push_back(&row);
  }
  for (Row* row : done) FreeRowLocked(*row, &out.reclaim, /*partition_dying=*/false);
  out.rows_freed = done.size();
  OpenTicketLocked(&out.reclaim);
  ++counters_.leases_acked;
  if (!done.empty()) space_cv_.NotifyAll();
  if (ack_log_) {
    // Under the lock: the log's lines are in the order the acks happened.
    if (Status st = ack_log_->Record(id, lease.task_name, lease.holder, partition, logged); !st.ok()) {
      return Status::DataLoss("lease " + std::to_string(id) + " was acked, but " + st.message());
    }
  }
  return out;
}

Result<ReleaseResponse> InProcessController::Release(const ReleaseRequest& request) {
  const LeaseId id = request.lease_id;
  MutexLock lock(&mu_);
  SLUICE_RETURN_IF_ERROR(CheckOpenLocked());
  ExpireLocked();
  const Clock::TimePoint now = clock_->Now();
  if (leases_.Find(id) == nullptr) return leases_.NotActive(id, "release", now);
  const LeaseRecord lease = leases_.End(id, LeaseEnd::kReleased, now);
  auto [returned, cleared] = ReturnRowsLocked(lease);
  ++counters_.leases_released;
  counters_.rows_redelivered += returned;
  SignalReadyLocked();
  return ReleaseResponse{returned, cleared};
}

Result<ReleaseHolderResponse> InProcessController::ReleaseHolder(const ReleaseHolderRequest& request) {
  if (request.holder.empty()) return Status::InvalidArgument("ReleaseHolder: the holder is empty");
  MutexLock lock(&mu_);
  SLUICE_RETURN_IF_ERROR(CheckOpenLocked());
  ExpireLocked();
  const Clock::TimePoint now = clock_->Now();
  ReleaseHolderResponse out;
  // Fenced: a GetMeta it sent before it died gets no lease (one waiting
  // here now wakes up and is refused).
  if (fenced_.insert_or_assign(request.holder, now + kHolderFence).second) {
    fenced_order_.push_back(request.holder);
    if (fenced_order_.size() > kMaxFencedHolders) {
      fenced_.erase(fenced_order_.front());
      fenced_order_.pop_front();
    }
  }
  for (LeaseId id : leases_.HeldBy(request.holder)) {
    const LeaseRecord lease = leases_.End(id, LeaseEnd::kReleased, now);
    auto [returned, cleared] = ReturnRowsLocked(lease);
    ++out.leases_released;
    out.rows_returned += returned;
    out.rows_cleared += cleared;
  }
  counters_.leases_released += out.leases_released;
  counters_.rows_redelivered += out.rows_returned;
  SignalReadyLocked();
  return out;
}

Status InProcessController::CheckNotFencedLocked(const std::string& holder, const std::string& what) {
  if (holder.empty() || fenced_.empty()) return Status::Ok();
  auto it = fenced_.find(holder);
  if (it == fenced_.end() || clock_->Now() >= it->second) return Status::Ok();
  return Status::FailedPrecondition(what + ": holder " + Quoted(holder) +
                                    " was released as gone (ReleaseHolder); a live process takes leases under a "
                                    "name of its own");
}

Result<RenewResponse> InProcessController::Renew(const RenewRequest& request) {
  const LeaseId id = request.lease_id;
  const std::string what = "renew of lease " + std::to_string(id);
  SLUICE_RETURN_IF_ERROR(ValidateTimeout(request.lease_timeout, what + ": lease_timeout"));
  if (request.lease_timeout > kMaxLeaseTimeout) {
    return Status::OutOfRange(what + ": lease_timeout " + std::to_string(request.lease_timeout.count()) +
                              " ms is above the longest lease, " + std::to_string(kMaxLeaseTimeout.count()) + " ms");
  }
  MutexLock lock(&mu_);
  SLUICE_RETURN_IF_ERROR(CheckOpenLocked());
  ExpireLocked();  // a lease past its deadline is gone, renewed or not
  const Clock::TimePoint now = clock_->Now();
  if (leases_.Find(id) == nullptr) return leases_.NotActive(id, "renew", now);
  const auto lease_timeout = request.lease_timeout.count() > 0 ? request.lease_timeout : options_.default_lease_timeout;
  const LeaseRecord& lease = leases_.SetDeadline(id, now + lease_timeout);
  // A GetMeta waiting for the earliest deadline wakes and looks again.
  SignalReadyLocked();
  return RenewResponse{lease.deadline};
}

}  // namespace sluice::transfer_queue::internal
