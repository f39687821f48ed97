// Setup, registration, partitions, stats and the indexing helpers of the
// in-process controller. See in_process_controller.h for the invariants.
#include <utility>

#include "core/in_process_controller.h"
#include "core/validation.h"
#include "sluice/common/check.h"

namespace sluice::transfer_queue {

std::vector<RowId> BatchMeta::row_ids() const {
  std::vector<RowId> ids;
  ids.reserve(rows.size());
  for (const RowMeta& r : rows) ids.push_back(r.id);
  return ids;
}

std::vector<size_t> BatchMeta::RowsOfRank(uint32_t r) const {
  std::vector<size_t> out;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rank.empty() ? r == 0 : rank[i] == r) out.push_back(i);
  }
  return out;
}

Result<std::shared_ptr<Controller>> NewInProcessController(ControllerOptions options) {
  if (options.capacity_rows == 0) return Status::InvalidArgument("ControllerOptions.capacity_rows must be > 0");
  if (options.capacity_bytes == 0) return Status::InvalidArgument("ControllerOptions.capacity_bytes must be > 0");
  if (options.default_lease_timeout.count() <= 0 || options.default_lease_timeout > kMaxLeaseTimeout) {
    return Status::InvalidArgument("ControllerOptions.default_lease_timeout must be in (0, 7 days], got " +
                                   std::to_string(options.default_lease_timeout.count()) + " ms");
  }
  if (options.max_batch_rows == 0) return Status::InvalidArgument("ControllerOptions.max_batch_rows must be > 0");
  if (options.max_tensor_bytes == 0) return Status::InvalidArgument("ControllerOptions.max_tensor_bytes must be > 0");
  if (options.max_views_per_partition == 0) {
    return Status::InvalidArgument("ControllerOptions.max_views_per_partition must be > 0");
  }
  auto controller = std::make_shared<internal::InProcessController>(std::move(options));
  SLUICE_RETURN_IF_ERROR(controller->Init().WithContext("ControllerOptions"));
  return std::shared_ptr<Controller>(std::move(controller));
}

namespace internal {

InProcessController::InProcessController(ControllerOptions options)
    : options_(std::move(options)),
      clock_(options_.clock ? options_.clock : std::make_shared<SteadyClock>()),
      leases_(options_.lease_history) {}

Status InProcessController::Init() {
  if (!options_.ack_log.empty()) {
    SLUICE_ASSIGN_OR_RETURN(ack_log_, AckLog::Open(options_.ack_log));
  }
  MutexLock lock(&mu_);
  SLUICE_RETURN_IF_ERROR(RegisterColumnsLocked(options_.columns));
  for (const std::string& task : options_.tasks) SLUICE_RETURN_IF_ERROR(RegisterTaskLocked(task));
  return Status::Ok();
}

Status InProcessController::CheckOpenLocked() const {
  if (closed_) return Status::Aborted("the TransferQueue controller is closed");
  return Status::Ok();
}

// ---------------------------------------------------------------- registration

Status InProcessController::RegisterColumns(const RegisterColumnsRequest& request) {
  MutexLock lock(&mu_);
  SLUICE_RETURN_IF_ERROR(CheckOpenLocked());
  return RegisterColumnsLocked(request.columns);
}

Status InProcessController::RegisterColumnsLocked(const std::vector<ColumnSchema>& columns) {
  // Validate everything first: registration is all-or-nothing.
  std::map<std::string, const ColumnSchema*, std::less<>> fresh;
  for (const ColumnSchema& schema : columns) {
    SLUICE_RETURN_IF_ERROR(ValidateSchema(schema));
    auto existing = columns_.find(schema.name);
    if (existing != columns_.end()) {
      if (existing->second.schema == schema) continue;
      return Status::InvalidArgument("column " + Quoted(schema.name) + " is already registered as " +
                                     std::string(DTypeName(existing->second.schema.dtype)) +
                                     ShapeToString(existing->second.schema.shape) + ", not " +
                                     std::string(DTypeName(schema.dtype)) + ShapeToString(schema.shape));
    }
    if (!fresh.emplace(schema.name, &schema).second) {
      return Status::InvalidArgument("column " + Quoted(schema.name) + " appears twice in the request");
    }
  }
  if (columns_by_index_.size() + fresh.size() > kMaxColumns) {
    return Status::ResourceExhausted("cannot register " + std::to_string(fresh.size()) +
                                     " more columns: " + std::to_string(columns_by_index_.size()) + " of at most " +
                                     std::to_string(kMaxColumns) + " are registered");
  }
  for (const ColumnSchema& schema : columns) {
    if (fresh.count(schema.name) == 0 || columns_.count(schema.name) > 0) continue;
    Column column{schema, static_cast<uint32_t>(columns_by_index_.size())};
    auto it = columns_.emplace(schema.name, std::move(column)).first;
    columns_by_index_.push_back(&it->second);
  }
  return Status::Ok();
}

Status InProcessController::RegisterTask(const RegisterTaskRequest& request) {
  MutexLock lock(&mu_);
  SLUICE_RETURN_IF_ERROR(CheckOpenLocked());
  return RegisterTaskLocked(request.task);
}

Status InProcessController::RegisterTaskLocked(const std::string& task) {
  SLUICE_RETURN_IF_ERROR(ValidateName("task", task));
  for (const std::string& t : tasks_) {
    if (t == task) return Status::Ok();
  }
  if (tasks_.size() >= kMaxTasks) {
    return Status::ResourceExhausted("cannot register task " + Quoted(task) + ": " + std::to_string(kMaxTasks) +
                                     " tasks are registered already");
  }
  tasks_.push_back(task);
  TaskDepth depth;
  depth.task = task;
  // Every visible row starts ready for the new task (slots default to kReady).
  for (const auto& [id, row] : rows_) depth.ready += row.visible ? 1 : 0;
  task_depth_.push_back(std::move(depth));
  return Status::Ok();
}

Result<DescribeResponse> InProcessController::Describe() {
  MutexLock lock(&mu_);
  SLUICE_RETURN_IF_ERROR(CheckOpenLocked());
  DescribeResponse out;
  for (const Column* c : columns_by_index_) out.columns.push_back(c->schema);
  out.tasks = tasks_;
  return out;
}

Result<CreatePartitionResponse> InProcessController::CreatePartition(const CreatePartitionRequest& request) {
  SLUICE_RETURN_IF_ERROR(ValidateName("partition", request.partition));
  MutexLock lock(&mu_);
  SLUICE_RETURN_IF_ERROR(CheckOpenLocked());
  std::vector<uint32_t> consumers;
  for (const std::string& task : request.consumers) {
    Result<uint32_t> index = FindTaskLocked(task);
    if (!index.ok()) return index.status().WithContext("consumer of partition " + Quoted(request.partition));
    if (std::find(consumers.begin(), consumers.end(), *index) != consumers.end()) {
      return Status::InvalidArgument("partition " + Quoted(request.partition) + " lists consumer " + Quoted(task) +
                                     " twice");
    }
    consumers.push_back(*index);
  }
  std::sort(consumers.begin(), consumers.end());
  auto it = partitions_.find(request.partition);
  if (it != partitions_.end()) {
    if (it->second->group_size != request.group_size) {
      return Status::AlreadyExists("partition " + Quoted(request.partition) + " exists with group_size " +
                                   std::to_string(it->second->group_size) + ", not " +
                                   std::to_string(request.group_size));
    }
    if (it->second->all_tasks != consumers.empty() || it->second->consumers != consumers) {
      return Status::AlreadyExists("partition " + Quoted(request.partition) + " exists with other consumers");
    }
    return CreatePartitionResponse{false};
  }
  auto partition = std::make_unique<Partition>();
  partition->id = request.partition;
  partition->group_size = request.group_size;
  partition->all_tasks = consumers.empty();
  partition->consumers = std::move(consumers);
  partition->incarnation = next_incarnation_++;
  partitions_.emplace(request.partition, std::move(partition));
  return CreatePartitionResponse{true};
}

// ---------------------------------------------------------------- lookups

Result<Partition*> InProcessController::FindPartitionLocked(const std::string& id) {
  auto it = partitions_.find(id);
  if (it == partitions_.end()) {
    return Status::NotFound("unknown partition " + Quoted(id) + " (create it first; a cleared partition is gone)");
  }
  return it->second.get();
}

Result<uint32_t> InProcessController::FindTaskLocked(const std::string& task) const {
  for (uint32_t t = 0; t < tasks_.size(); ++t) {
    if (tasks_[t] == task) return t;
  }
  return Status::NotFound("unknown task " + Quoted(task) + " (register it first)");
}

Result<uint64_t> InProcessController::ColumnMaskLocked(const std::vector<std::string>& columns) const {
  uint64_t mask = 0;
  for (const std::string& name : columns) {
    auto it = columns_.find(name);
    if (it == columns_.end()) return Status::NotFound("unknown column " + Quoted(name));
    const uint64_t bit = uint64_t{1} << it->second.index;
    if (mask & bit) return Status::InvalidArgument("column " + Quoted(name) + " is listed twice");
    mask |= bit;
  }
  return mask;
}

std::vector<std::string> InProcessController::ColumnNamesLocked(uint64_t mask) const {
  std::vector<std::string> out;
  for (const Column* c : columns_by_index_) {
    if (mask & (uint64_t{1} << c->index)) out.push_back(c->schema.name);
  }
  return out;
}

// ---------------------------------------------------------------- indexing

bool InProcessController::EligibleLocked(const Row& row, const ReadyView& view) const {
  return row.visible && (row.committed & view.mask()) == view.mask() && row.state(view.task()) == Consumption::kReady;
}

void InProcessController::UnindexLocked(const Row& row) {
  for (auto& [key, view] : row.partition->views) {
    view->RemoveRow(row.id, row.tags.policy_version, row.tags.group_id);
  }
}

void InProcessController::IndexLocked(const Row& row) {
  for (auto& [key, view] : row.partition->views) {
    if (EligibleLocked(row, *view)) view->AddRow(row.id, row.tags.policy_version, row.tags.group_id);
  }
}

GroupSummary InProcessController::SummarizeLocked(const Group& group) const {
  GroupSummary s;
  s.created = group.created;
  s.alive = static_cast<uint32_t>(group.rows.size());
  bool first = true;
  for (RowId id : group.rows) {
    const Row& row = rows_.at(id);
    const PolicyVersion v = row.tags.policy_version;
    s.min_version = first ? v : std::min(s.min_version, v);
    s.max_version = first ? v : std::max(s.max_version, v);
    first = false;
  }
  s.first_row = group.rows.empty() ? 0 : group.rows.front();
  return s;
}

void InProcessController::RefreshGroupLocked(Partition& partition, GroupId group) {
  auto it = partition.groups.find(group);
  if (it == partition.groups.end()) return;
  const GroupSummary summary = SummarizeLocked(it->second);
  for (auto& [key, view] : partition.views) view->RefreshGroup(group, summary);
}

Result<ReadyView*> InProcessController::ViewLocked(Partition& partition, uint32_t task, uint64_t mask) {
  auto key = std::make_pair(task, mask);
  auto it = partition.views.find(key);
  if (it != partition.views.end()) return it->second.get();
  if (partition.views.size() >= options_.max_views_per_partition) {
    return Status::ResourceExhausted("partition " + Quoted(partition.id) + " already has " +
                                     std::to_string(partition.views.size()) +
                                     " ready views (one per distinct task and column set requested; "
                                     "max_views_per_partition=" +
                                     std::to_string(options_.max_views_per_partition) + ")");
  }
  // Built once per (task, column set): the only place that walks a
  // partition's rows on the read path.
  auto view = std::make_unique<ReadyView>(task, mask);
  for (RowId id : partition.rows) {
    const Row& row = rows_.at(id);
    if (EligibleLocked(row, *view)) view->AddRow(row.id, row.tags.policy_version, row.tags.group_id);
  }
  for (const auto& [group_id, group] : partition.groups) view->RefreshGroup(group_id, SummarizeLocked(group));
  ReadyView* raw = view.get();
  partition.views.emplace(key, std::move(view));
  return raw;
}

void InProcessController::CountRowLocked(const Row& row, int sign) {
  SLUICE_CHECK(row.visible);
  for (uint32_t t = 0; t < task_depth_.size(); ++t) {
    if (!row.partition->Consumes(t)) continue;  // not this task's row
    TaskDepth& d = task_depth_[t];
    uint64_t& counter = row.state(t) == Consumption::kReady    ? d.ready
                        : row.state(t) == Consumption::kLeased ? d.leased
                                                               : d.acked;
    if (sign > 0) {
      ++counter;
    } else {
      SLUICE_CHECK(counter > 0) << "task depth underflow for task " << d.task;
      --counter;
    }
  }
}

// ---------------------------------------------------------------- stats, close

Result<ControllerStats> InProcessController::Stats() {
  MutexLock lock(&mu_);
  SLUICE_RETURN_IF_ERROR(CheckOpenLocked());
  ExpireLocked();
  ControllerStats s = counters_;
  s.rows = rows_.size();
  s.capacity_rows = options_.capacity_rows;
  s.bytes_committed = bytes_committed_;
  s.bytes_reserved = bytes_reserved_;
  s.bytes_reclaiming = bytes_reclaiming_;
  s.bytes_held = BytesHeldLocked();
  s.capacity_bytes = options_.capacity_bytes;
  s.partitions = partitions_.size();
  s.active_leases = leases_.active();
  s.open_writes = writes_.size();
  s.waiting_consumers = waiting_consumers_;
  s.waiting_producers = waiting_producers_;
  s.tasks = task_depth_;
  return s;
}

Status InProcessController::FinishReclaim(const FinishReclaimRequest& request) {
  const ReclaimId id = request.reclaim_id;
  MutexLock lock(&mu_);
  SLUICE_RETURN_IF_ERROR(CheckOpenLocked());
  auto it = reclaims_.find(id);
  if (it == reclaims_.end()) {
    return Status::NotFound("reclaim ticket " + std::to_string(id) +
                            " is not open (finished already, or never issued)");
  }
  bytes_reclaiming_ -= it->second;
  reclaims_.erase(it);
  space_cv_.NotifyAll();
  return Status::Ok();
}

void InProcessController::Close() {
  MutexLock lock(&mu_);
  closed_ = true;
  SignalReadyLocked();
  space_cv_.NotifyAll();
}

}  // namespace internal
}  // namespace sluice::transfer_queue
