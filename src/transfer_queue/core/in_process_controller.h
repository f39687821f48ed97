// The in-process Controller (see include/sluice/transfer_queue/controller.h
// for the contract). Its implementation is split by concern:
//   controller.cc        setup, registration, partitions, stats, indexing helpers
//   controller_write.cc  row creation, two-phase writes, freeing, clear, key-value
//   controller_lease.cc  GetMeta, Ack, Release, Renew, expiry
//
// State invariants (all under mu_):
//  * rows_ holds every alive row; each is in exactly one partition's `rows`.
//    A row is `visible` once created by CreateRows or by a committed write;
//    rows of an open write are invisible to every read path.
//  * A row is in view V of its partition iff it is visible, every column of
//    V's mask is committed, and V's task has it in state kReady. Every
//    mutation of those fields (or of the row's policy version, the view key)
//    goes through Unindex -> mutate -> Index -> RefreshGroups.
//  * task_depth_[t] counts the visible rows in each state for task t.
//  * bytes_committed_ = sum of rows' committed bytes; bytes_reserved_ = sum
//    of open writes' reservations; bytes_reclaiming_ = sum of open reclaim
//    tickets. Their sum never exceeds capacity_bytes; rows_.size() never
//    exceeds capacity_rows.
//
// Thread safety: every public method is thread-safe; all state is guarded by
// the one mutex mu_, which is never held while calling out of the class.
#ifndef SLUICE_SRC_TRANSFER_QUEUE_IN_PROCESS_CONTROLLER_H_
#define SLUICE_SRC_TRANSFER_QUEUE_IN_PROCESS_CONTROLLER_H_

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/ack_log.h"
#include "core/lease_table.h"
#include "core/ready_view.h"
#include "sluice/common/mutex.h"
#include "sluice/transfer_queue/controller.h"

namespace sluice::transfer_queue::internal {

enum class Consumption : uint8_t { kReady, kLeased, kAcked };

struct TaskSlot {
  Consumption state = Consumption::kReady;
  LeaseId lease = 0;  // the lease holding the row, while kLeased
};

struct Partition;

struct Row {
  RowId id = 0;
  Partition* partition = nullptr;
  RowTags tags;
  std::string key;         // empty: no key
  uint64_t committed = 0;  // column mask
  uint64_t writing = 0;    // columns reserved by an open write
  bool visible = false;
  uint64_t bytes = 0;           // committed payload bytes
  std::vector<TaskSlot> tasks;  // by task index; missing entries are kReady
  uint32_t acked = 0;           // tasks in state kAcked

  Consumption state(uint32_t task) const { return task < tasks.size() ? tasks[task].state : Consumption::kReady; }
  TaskSlot& slot(uint32_t task) {
    if (task >= tasks.size()) tasks.resize(task + 1);
    return tasks[task];
  }
};

struct Group {
  uint32_t created = 0;
  std::vector<RowId> rows;  // alive rows, ascending
};

struct Partition {
  std::string id;
  uint32_t group_size = 0;
  // Task indices consuming the partition, ascending; `all_tasks`: every task.
  bool all_tasks = true;
  std::vector<uint32_t> consumers;
  bool Consumes(uint32_t task) const {
    return all_tasks || std::binary_search(consumers.begin(), consumers.end(), task);
  }
  uint64_t incarnation = 0;  // distinguishes a re-created partition of the same name
  std::unordered_set<RowId> rows;
  std::unordered_map<GroupId, Group> groups;
  std::unordered_map<std::string, RowId> keys;
  // Keyed by (task, column mask).
  std::map<std::pair<uint32_t, uint64_t>, std::unique_ptr<ReadyView>> views;
};

struct OpenWrite {
  WriteId id = 0;
  std::vector<RowId> rows;
  std::vector<bool> creates;        // creates[i]: rows[i] was created by this write
  std::vector<uint64_t> row_bytes;  // payload bytes per row
  std::vector<RowTagPatch> patches;
  uint64_t mask = 0;
  uint64_t reserved = 0;
};

class InProcessController final : public Controller {
 public:
  explicit InProcessController(ControllerOptions options);

  // Validates and applies options.columns / options.tasks.
  Status Init();

  Status RegisterColumns(const RegisterColumnsRequest& request) override;
  Status RegisterTask(const RegisterTaskRequest& request) override;
  Result<DescribeResponse> Describe() override;
  Result<CreatePartitionResponse> CreatePartition(const CreatePartitionRequest& request) override;
  Result<CreateRowsResponse> CreateRows(const CreateRowsRequest& request) override;
  Result<BeginWriteResponse> BeginWrite(const BeginWriteRequest& request) override;
  Status CommitWrite(const CommitWriteRequest& request) override;
  Status AbortWrite(const AbortWriteRequest& request) override;
  Result<BatchMeta> GetMeta(const GetMetaRequest& request) override;
  Result<AckResponse> Ack(const AckRequest& request) override;
  Result<ReleaseResponse> Release(const ReleaseRequest& request) override;
  Result<RenewResponse> Renew(const RenewRequest& request) override;
  Result<ReleaseHolderResponse> ReleaseHolder(const ReleaseHolderRequest& request) override;
  Result<ClearResponse> ClearPartition(const ClearPartitionRequest& request) override;
  Result<std::vector<KvEntry>> KvLookup(const KvLookupRequest& request) override;
  Result<std::vector<KvEntry>> KvList(const KvListRequest& request) override;
  Result<ClearResponse> KvClear(const KvClearRequest& request) override;
  Status FinishReclaim(const FinishReclaimRequest& request) override;
  Result<ControllerStats> Stats() override;
  void Close() override;

 private:
  struct Column {
    ColumnSchema schema;
    uint32_t index = 0;
  };
  // A row to be created by CreateRows or a write.
  struct NewRow {
    RowTags tags;
    std::string key;
  };

  // ---- controller.cc: common helpers
  Status CheckOpenLocked() const SLUICE_REQUIRES(mu_);
  Status RegisterColumnsLocked(const std::vector<ColumnSchema>& columns) SLUICE_REQUIRES(mu_);
  Status RegisterTaskLocked(const std::string& task) SLUICE_REQUIRES(mu_);
  Result<Partition*> FindPartitionLocked(const std::string& id) SLUICE_REQUIRES(mu_);
  Result<uint32_t> FindTaskLocked(const std::string& task) const SLUICE_REQUIRES(mu_);
  // Mask of `columns`; NotFound for an unknown one, InvalidArgument for a duplicate.
  Result<uint64_t> ColumnMaskLocked(const std::vector<std::string>& columns) const SLUICE_REQUIRES(mu_);
  std::vector<std::string> ColumnNamesLocked(uint64_t mask) const SLUICE_REQUIRES(mu_);
  bool EligibleLocked(const Row& row, const ReadyView& view) const SLUICE_REQUIRES(mu_);
  void UnindexLocked(const Row& row) SLUICE_REQUIRES(mu_);
  void IndexLocked(const Row& row) SLUICE_REQUIRES(mu_);
  GroupSummary SummarizeLocked(const Group& group) const SLUICE_REQUIRES(mu_);
  void RefreshGroupLocked(Partition& partition, GroupId group) SLUICE_REQUIRES(mu_);
  // Runs `mutate` on each row between Unindex and Index, then refreshes the
  // rows' groups in every view of their partitions.
  template <typename Fn>
  void MutateRowsLocked(const std::vector<Row*>& rows, Fn mutate) SLUICE_REQUIRES(mu_);
  Result<ReadyView*> ViewLocked(Partition& partition, uint32_t task, uint64_t mask) SLUICE_REQUIRES(mu_);
  // Adjusts task_depth_ for a visible row leaving (`sign` = -1) or entering (+1).
  void CountRowLocked(const Row& row, int sign) SLUICE_REQUIRES(mu_);
  uint64_t BytesHeldLocked() const SLUICE_REQUIRES(mu_) {
    return bytes_committed_ + bytes_reserved_ + bytes_reclaiming_;
  }
  // Wakes GetMeta waiters: something may have become eligible (or vanished).
  void SignalReadyLocked() SLUICE_REQUIRES(mu_) {
    ++ready_epoch_;
    ready_cv_.NotifyAll();
  }

  // ---- controller_write.cc
  // Checks that `rows` can be created in `partition` (keys free, group sizes).
  Status CheckNewRowsLocked(const Partition& partition, const std::vector<NewRow>& rows) const SLUICE_REQUIRES(mu_);
  // Waits until `rows` more rows and `bytes` more bytes fit. `recheck` runs
  // after every wait (state may have changed) and its error is returned.
  // `rows` is read after each recheck (the recheck may update it).
  template <typename Recheck>
  Status WaitForCapacityLocked(const uint64_t& rows, uint64_t bytes, const CapacityWait& wait, std::string_view what,
                               Recheck recheck) SLUICE_REQUIRES(mu_);
  Row& AddRowLocked(Partition& partition, NewRow spec, bool visible) SLUICE_REQUIRES(mu_);
  // Frees an alive row: out of every index, its id and bytes onto `ticket`
  // (null: the row has no stored bytes). `partition_dying` skips the view
  // upkeep when the whole partition is being removed.
  void FreeRowLocked(Row& row, ReclaimTicket* ticket, bool partition_dying) SLUICE_REQUIRES(mu_);
  // Gives the ticket an id and starts counting its bytes as reclaiming.
  void OpenTicketLocked(ReclaimTicket* ticket) SLUICE_REQUIRES(mu_);
  KvEntry MakeKvEntryLocked(const Row& row) const SLUICE_REQUIRES(mu_);

  // ---- controller_lease.cc
  // Processes expired leases; returns how many expired.
  size_t ExpireLocked() SLUICE_REQUIRES(mu_);
  // Returns a lease's rows that are still alive and leased by it to ready.
  // Returns (rows returned, rows cleared).
  std::pair<uint64_t, uint64_t> ReturnRowsLocked(const LeaseRecord& lease) SLUICE_REQUIRES(mu_);
  // FailedPrecondition if `holder` was given to ReleaseHolder less than
  // kHolderFence ago.
  Status CheckNotFencedLocked(const std::string& holder, const std::string& what) SLUICE_REQUIRES(mu_);

  const ControllerOptions options_;
  const std::shared_ptr<const Clock> clock_;
  std::unique_ptr<AckLog> ack_log_;  // options_.ack_log's; set by Init

  Mutex mu_;
  CondVar ready_cv_;  // GetMeta waiters; signalled with ready_epoch_
  CondVar space_cv_;  // producers waiting for capacity
  bool closed_ SLUICE_GUARDED_BY(mu_) = false;
  uint64_t ready_epoch_ SLUICE_GUARDED_BY(mu_) = 0;
  uint64_t waiting_consumers_ SLUICE_GUARDED_BY(mu_) = 0;
  uint64_t waiting_producers_ SLUICE_GUARDED_BY(mu_) = 0;

  std::map<std::string, Column, std::less<>> columns_ SLUICE_GUARDED_BY(mu_);
  std::vector<const Column*> columns_by_index_ SLUICE_GUARDED_BY(mu_);
  std::vector<std::string> tasks_ SLUICE_GUARDED_BY(mu_);
  std::vector<TaskDepth> task_depth_ SLUICE_GUARDED_BY(mu_);

  std::map<std::string, std::unique_ptr<Partition>, std::less<>> partitions_ SLUICE_GUARDED_BY(mu_);
  uint64_t next_incarnation_ SLUICE_GUARDED_BY(mu_) = 1;
  std::unordered_map<RowId, Row> rows_ SLUICE_GUARDED_BY(mu_);
  RowId next_row_ SLUICE_GUARDED_BY(mu_) = 1;
  std::unordered_map<WriteId, OpenWrite> writes_ SLUICE_GUARDED_BY(mu_);
  WriteId next_write_ SLUICE_GUARDED_BY(mu_) = 1;
  std::unordered_map<ReclaimId, uint64_t> reclaims_ SLUICE_GUARDED_BY(mu_);  // id -> bytes
  ReclaimId next_reclaim_ SLUICE_GUARDED_BY(mu_) = 1;
  LeaseTable leases_ SLUICE_GUARDED_BY(mu_);
  // Holders given to ReleaseHolder, until when they stay fenced (controller
  // clock), and in the order they were fenced (oldest dropped first).
  std::unordered_map<std::string, Clock::TimePoint> fenced_ SLUICE_GUARDED_BY(mu_);
  std::deque<std::string> fenced_order_ SLUICE_GUARDED_BY(mu_);

  uint64_t bytes_committed_ SLUICE_GUARDED_BY(mu_) = 0;
  uint64_t bytes_reserved_ SLUICE_GUARDED_BY(mu_) = 0;
  uint64_t bytes_reclaiming_ SLUICE_GUARDED_BY(mu_) = 0;

  ControllerStats counters_ SLUICE_GUARDED_BY(mu_);  // only the "since start" counters are used
};

template <typename Fn>
void InProcessController::MutateRowsLocked(const std::vector<Row*>& rows, Fn mutate) {
  for (Row* row : rows) UnindexLocked(*row);
  for (Row* row : rows) mutate(*row);
  for (Row* row : rows) IndexLocked(*row);
  // Each (partition, group) once.
  std::vector<std::pair<Partition*, GroupId>> groups;
  for (Row* row : rows) {
    if (row->tags.group_id != kNoGroup) groups.emplace_back(row->partition, row->tags.group_id);
  }
  std::sort(groups.begin(), groups.end());
  groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
  for (auto& [partition, group] : groups) RefreshGroupLocked(*partition, group);
}

}  // namespace sluice::transfer_queue::internal

#endif  // SLUICE_SRC_TRANSFER_QUEUE_IN_PROCESS_CONTROLLER_H_
