// Row creation, two-phase writes, freeing, clearing and the key-value view
// of the in-process controller.
#include <chrono>
#include <set>
#include <utility>

#include "core/in_process_controller.h"
#include "core/validation.h"
#include "sluice/common/check.h"

namespace sluice::transfer_queue::internal {
namespace {

std::string RowName(RowId id) { return "row " + std::to_string(id); }

}  // namespace

// ---------------------------------------------------------------- helpers

Status InProcessController::CheckNewRowsLocked(const Partition& partition, const std::vector<NewRow>& rows) const {
  std::map<GroupId, uint32_t> added;
  for (const NewRow& row : rows) {
    if (!row.key.empty()) {
      auto it = partition.keys.find(row.key);
      if (it != partition.keys.end()) {
        return Status::AlreadyExists("key " + Quoted(row.key) + " already exists in partition " + Quoted(partition.id) +
                                     " (" + RowName(it->second) + ")");
      }
    }
    if (row.tags.group_id != kNoGroup) ++added[row.tags.group_id];
  }
  if (partition.group_size == 0) return Status::Ok();
  for (const auto& [group, count] : added) {
    auto it = partition.groups.find(group);
    const uint32_t created = it == partition.groups.end() ? 0 : it->second.created;
    if (created + count > partition.group_size) {
      return Status::FailedPrecondition("group " + std::to_string(group) + " in partition " + Quoted(partition.id) +
                                        " would have " + std::to_string(created + count) +
                                        " rows; the partition's group_size is " + std::to_string(partition.group_size));
    }
  }
  return Status::Ok();
}

template <typename Recheck>
Status InProcessController::WaitForCapacityLocked(const uint64_t& rows, uint64_t bytes, const CapacityWait& wait,
                                                  std::string_view what, Recheck recheck) {
  auto usage = [&]() SLUICE_REQUIRES(mu_) {
    return std::to_string(rows_.size()) + "/" + std::to_string(options_.capacity_rows) + " rows and " +
           std::to_string(BytesHeldLocked()) + "/" + std::to_string(options_.capacity_bytes) +
           " bytes held; it needs " + std::to_string(rows) + " rows and " + std::to_string(bytes) + " bytes";
  };
  auto fits = [&]() SLUICE_REQUIRES(mu_) {
    return rows_.size() + rows <= options_.capacity_rows && BytesHeldLocked() + bytes <= options_.capacity_bytes;
  };
  const auto deadline = DeadlineAfter(wait.timeout);
  while (true) {
    SLUICE_RETURN_IF_ERROR(CheckOpenLocked());
    SLUICE_RETURN_IF_ERROR(recheck());
    if (rows > options_.capacity_rows || bytes > options_.capacity_bytes) {
      return Status::ResourceExhausted(std::string(what) + " can never fit: it needs " + std::to_string(rows) +
                                       " rows and " + std::to_string(bytes) + " bytes, the capacity is " +
                                       std::to_string(options_.capacity_rows) + " rows and " +
                                       std::to_string(options_.capacity_bytes) + " bytes");
    }
    if (fits()) return Status::Ok();
    if (!wait.block) {
      return Status::ResourceExhausted(std::string(what) + ": the queue is full (" + usage() +
                                       "); retry later, or let consumers catch up");
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status::Timeout(std::string(what) + ": no capacity within " + std::to_string(wait.timeout.count()) +
                             " ms (" + usage() + ")");
    }
    ++waiting_producers_;
    space_cv_.WaitUntil(&mu_, deadline, [&]() SLUICE_REQUIRES(mu_) { return closed_ || fits(); });
    --waiting_producers_;
    ExpireLocked();
  }
}

Row& InProcessController::AddRowLocked(Partition& partition, NewRow spec, bool visible) {
  const RowId id = next_row_++;
  Row& row = rows_[id];
  row.id = id;
  row.partition = &partition;
  row.tags = std::move(spec.tags);
  row.key = std::move(spec.key);
  row.visible = visible;
  partition.rows.insert(id);
  if (row.tags.group_id != kNoGroup) {
    Group& group = partition.groups[row.tags.group_id];
    ++group.created;
    group.rows.push_back(id);  // ids only grow: stays ascending
  }
  if (!row.key.empty()) partition.keys.emplace(row.key, id);
  if (visible) {
    CountRowLocked(row, +1);
    IndexLocked(row);
  }
  ++counters_.rows_created;
  return row;
}

void InProcessController::FreeRowLocked(Row& row, ReclaimTicket* ticket, bool partition_dying) {
  Partition& partition = *row.partition;
  const RowId id = row.id;
  if (!partition_dying) UnindexLocked(row);
  if (row.visible) CountRowLocked(row, -1);
  partition.rows.erase(id);
  if (row.tags.group_id != kNoGroup) {
    auto git = partition.groups.find(row.tags.group_id);
    SLUICE_CHECK(git != partition.groups.end());
    auto& members = git->second.rows;
    members.erase(std::find(members.begin(), members.end(), id));
    if (members.empty()) {
      partition.groups.erase(git);
    } else if (!partition_dying) {
      RefreshGroupLocked(partition, row.tags.group_id);
    }
  }
  if (!row.key.empty()) partition.keys.erase(row.key);
  bytes_committed_ -= row.bytes;
  if (ticket != nullptr) {
    ticket->bytes += row.bytes;
    ticket->rows.push_back(id);
  }
  rows_.erase(id);
  ++counters_.rows_freed;
}

void InProcessController::OpenTicketLocked(ReclaimTicket* ticket) {
  if (ticket->rows.empty()) return;
  ticket->id = next_reclaim_++;
  reclaims_.emplace(ticket->id, ticket->bytes);
  bytes_reclaiming_ += ticket->bytes;
}

KvEntry InProcessController::MakeKvEntryLocked(const Row& row) const {
  return KvEntry{row.key, row.id, row.tags, ColumnNamesLocked(row.committed)};
}

// ---------------------------------------------------------------- CreateRows

Result<CreateRowsResponse> InProcessController::CreateRows(const CreateRowsRequest& request) {
  const std::string what =
      "CreateRows(partition " + Quoted(request.partition) + ", " + std::to_string(request.rows.size()) + " rows)";
  SLUICE_RETURN_IF_ERROR(ValidateName("partition", request.partition));
  SLUICE_RETURN_IF_ERROR(ValidateTimeout(request.wait.timeout, what + ": wait.timeout"));
  if (request.rows.empty()) return Status::InvalidArgument(what + ": no rows");
  if (request.rows.size() > options_.max_batch_rows) {
    return Status::OutOfRange(what + ": more than max_batch_rows=" + std::to_string(options_.max_batch_rows));
  }
  if (!request.keys.empty() && request.keys.size() != request.rows.size()) {
    return Status::InvalidArgument(what + ": " + std::to_string(request.keys.size()) + " keys for " +
                                   std::to_string(request.rows.size()) + " rows");
  }
  std::vector<NewRow> specs(request.rows.size());
  std::set<std::string_view> keys;
  for (size_t i = 0; i < specs.size(); ++i) {
    SLUICE_RETURN_IF_ERROR(
        PrefixWhere(ValidateTags(request.rows[i], ""), [&] { return what + ", row " + std::to_string(i); }));
    specs[i].tags = request.rows[i];
    if (!request.keys.empty()) {
      SLUICE_RETURN_IF_ERROR(ValidateName("key", request.keys[i]));
      if (!keys.insert(request.keys[i]).second) {
        return Status::InvalidArgument(what + ": key " + Quoted(request.keys[i]) + " appears twice");
      }
      specs[i].key = request.keys[i];
    }
  }

  MutexLock lock(&mu_);
  SLUICE_RETURN_IF_ERROR(CheckOpenLocked());
  ExpireLocked();
  Partition* partition = nullptr;
  const uint64_t rows_needed = specs.size();
  SLUICE_RETURN_IF_ERROR(
      WaitForCapacityLocked(rows_needed, 0, request.wait, what, [&]() SLUICE_REQUIRES(mu_) -> Status {
        SLUICE_ASSIGN_OR_RETURN(partition, FindPartitionLocked(request.partition));
        return CheckNewRowsLocked(*partition, specs);
      }));
  CreateRowsResponse out;
  std::set<GroupId> groups;
  for (NewRow& spec : specs) {
    if (spec.tags.group_id != kNoGroup) groups.insert(spec.tags.group_id);
    out.rows.push_back(AddRowLocked(*partition, std::move(spec), /*visible=*/true).id);
  }
  for (GroupId g : groups) RefreshGroupLocked(*partition, g);
  return out;
}

// ---------------------------------------------------------------- BeginWrite

Result<BeginWriteResponse> InProcessController::BeginWrite(const BeginWriteRequest& request) {
  std::string what = "write";
  size_t n = 0;
  switch (request.target) {
    case WriteTarget::kExistingRows:
      n = request.rows.size();
      if (!request.new_rows.empty() || !request.keys.empty()) {
        return Status::InvalidArgument("write to existing rows takes `rows` only, not new_rows or keys");
      }
      what = "write of " + std::to_string(n) + " existing rows";
      break;
    case WriteTarget::kNewRows:
      n = request.new_rows.size();
      if (!request.rows.empty() || !request.keys.empty()) {
        return Status::InvalidArgument("write of new rows takes `new_rows` only, not rows or keys");
      }
      what = "write of " + std::to_string(n) + " new rows into partition " + Quoted(request.partition);
      break;
    case WriteTarget::kKeys:
      n = request.keys.size();
      if (!request.rows.empty() || request.new_rows.size() != n) {
        return Status::InvalidArgument("write by key takes `keys` and one `new_rows` entry per key, not rows");
      }
      what = "write of " + std::to_string(n) + " keys into partition " + Quoted(request.partition);
      break;
  }
  if (request.target != WriteTarget::kExistingRows || !request.partition.empty()) {
    SLUICE_RETURN_IF_ERROR(ValidateName("partition", request.partition));
  }
  SLUICE_RETURN_IF_ERROR(ValidateTimeout(request.wait.timeout, what + ": wait.timeout"));
  if (n == 0) return Status::InvalidArgument(what + ": no target rows");
  if (n > options_.max_batch_rows) {
    return Status::OutOfRange(what + ": more than max_batch_rows=" + std::to_string(options_.max_batch_rows));
  }
  if (!request.patches.empty() && request.patches.size() != n) {
    return Status::InvalidArgument(what + ": " + std::to_string(request.patches.size()) + " tag patches for " +
                                   std::to_string(n) + " rows");
  }
  if (request.columns.empty() && request.target == WriteTarget::kExistingRows && request.patches.empty()) {
    return Status::InvalidArgument(what + ": nothing to write (no columns, no tag patches)");
  }
  for (size_t i = 0; i < request.patches.size(); ++i) {
    SLUICE_RETURN_IF_ERROR(
        PrefixWhere(ValidatePatch(request.patches[i], ""), [&] { return what + ", patch " + std::to_string(i); }));
  }
  for (size_t i = 0; i < request.new_rows.size(); ++i) {
    SLUICE_RETURN_IF_ERROR(
        PrefixWhere(ValidateTags(request.new_rows[i], ""), [&] { return what + ", new row " + std::to_string(i); }));
  }
  std::set<std::string_view> keys;
  for (const std::string& key : request.keys) {
    SLUICE_RETURN_IF_ERROR(ValidateName("key", key));
    if (!keys.insert(key).second) return Status::InvalidArgument(what + ": key " + Quoted(key) + " appears twice");
  }
  std::set<RowId> ids;
  for (RowId id : request.rows) {
    if (!ids.insert(id).second) return Status::InvalidArgument(what + ": " + RowName(id) + " appears twice");
  }
  std::vector<std::string> names;
  for (const ColumnWriteMeta& column : request.columns) {
    if (column.rows.size() != n) {
      return Status::InvalidArgument(what + ": column " + Quoted(column.column) + " has " +
                                     std::to_string(column.rows.size()) + " tensors for " + std::to_string(n) +
                                     " rows");
    }
    names.push_back(column.column);
  }

  MutexLock lock(&mu_);
  SLUICE_RETURN_IF_ERROR(CheckOpenLocked());
  ExpireLocked();
  Result<uint64_t> mask_or = ColumnMaskLocked(names);
  if (!mask_or.ok()) return mask_or.status().WithContext(what);
  const uint64_t mask = *mask_or;
  std::vector<uint64_t> row_bytes(n, 0);
  uint64_t total = 0;
  for (const ColumnWriteMeta& column : request.columns) {
    const ColumnSchema& schema = columns_.find(column.column)->second.schema;
    for (size_t i = 0; i < n; ++i) {
      auto where = [&] {
        return what + ", column " + Quoted(column.column) + ", row " +
               (request.target == WriteTarget::kExistingRows ? std::to_string(request.rows[i])
                : request.target == WriteTarget::kKeys       ? "with key " + Quoted(request.keys[i])
                                                             : "#" + std::to_string(i));
      };
      SLUICE_RETURN_IF_ERROR(
          PrefixWhere(ValidateTensorMeta(schema, column.rows[i], options_.max_tensor_bytes, ""), where));
      row_bytes[i] += column.rows[i].nbytes;
      total += column.rows[i].nbytes;
    }
  }

  // Resolved anew after every wait for capacity: rows may have been freed,
  // keys taken or partitions cleared meanwhile.
  Partition* partition = nullptr;
  std::vector<Row*> targets;      // null where the write creates the row
  std::vector<NewRow> creations;  // in target order
  auto resolve = [&]() SLUICE_REQUIRES(mu_) -> Status {
    partition = nullptr;
    targets.assign(n, nullptr);
    creations.clear();
    if (!request.partition.empty()) {
      SLUICE_ASSIGN_OR_RETURN(partition, FindPartitionLocked(request.partition));
    }
    auto check_cells = [&](const Row& row, std::string_view label) SLUICE_REQUIRES(mu_) -> Status {
      const uint64_t taken = (row.committed | row.writing) & mask;
      if (taken != 0) {
        const std::string column = ColumnNamesLocked(taken & -taken).front();
        return Status::AlreadyExists(what + ": " + std::string(label) + " column " + Quoted(column) +
                                     ((row.committed & taken) ? " is already written (columns are written once)"
                                                              : " is being written by another write"));
      }
      return Status::Ok();
    };
    for (size_t i = 0; i < n; ++i) {
      Row* row = nullptr;
      std::string label;
      if (request.target == WriteTarget::kExistingRows) {
        label = RowName(request.rows[i]);
        auto it = rows_.find(request.rows[i]);
        if (it == rows_.end() || !it->second.visible) {
          return Status::NotFound(what + ": " + label + " does not exist (never created, freed, or cleared)");
        }
        row = &it->second;
        if (partition != nullptr && row->partition != partition) {
          return Status::InvalidArgument(what + ": " + label + " is in partition " + Quoted(row->partition->id) +
                                         ", not " + Quoted(partition->id));
        }
      } else if (request.target == WriteTarget::kKeys) {
        label = "key " + Quoted(request.keys[i]);
        auto it = partition->keys.find(request.keys[i]);
        if (it != partition->keys.end()) {
          row = &rows_.at(it->second);
          if (!row->visible) return Status::AlreadyExists(what + ": " + label + " is being created by another write");
        }
      }
      if (row == nullptr) {
        creations.push_back(NewRow{request.new_rows[i], request.target == WriteTarget::kKeys ? request.keys[i] : ""});
        continue;
      }
      SLUICE_RETURN_IF_ERROR(check_cells(*row, label));
      if (!request.patches.empty()) {
        std::set<std::string_view> user;
        for (const auto& [k, v] : row->tags.user) user.insert(k);
        for (const auto& [k, v] : request.patches[i].user) user.insert(k);
        if (user.size() > kMaxUserTags) {
          return Status::InvalidArgument(what + ": " + label + " would have " + std::to_string(user.size()) +
                                         " user tags, at most " + std::to_string(kMaxUserTags) + " allowed");
        }
      }
      targets[i] = row;
    }
    if (!creations.empty()) SLUICE_RETURN_IF_ERROR(CheckNewRowsLocked(*partition, creations));
    return Status::Ok();
  };
  // `rows_needed` is re-evaluated after every resolve: a key may have been
  // created by another write while this one waited.
  uint64_t rows_needed = 0;
  SLUICE_RETURN_IF_ERROR(
      WaitForCapacityLocked(rows_needed, total, request.wait, what, [&]() SLUICE_REQUIRES(mu_) -> Status {
        Status s = resolve();
        rows_needed = creations.size();
        return s;
      }));

  OpenWrite write;
  write.id = next_write_++;
  write.mask = mask;
  write.reserved = total;
  write.row_bytes = std::move(row_bytes);
  write.patches = request.patches;
  write.creates.assign(n, false);
  std::set<GroupId> groups;
  size_t next_creation = 0;
  for (size_t i = 0; i < n; ++i) {
    Row* row = targets[i];
    if (row == nullptr) {
      row = &AddRowLocked(*partition, std::move(creations[next_creation++]), /*visible=*/false);
      write.creates[i] = true;
      if (row->tags.group_id != kNoGroup) groups.insert(row->tags.group_id);
    }
    row->writing |= mask;
    write.rows.push_back(row->id);
  }
  for (GroupId g : groups) RefreshGroupLocked(*partition, g);
  bytes_reserved_ += total;
  BeginWriteResponse out{write.id, write.rows, total};
  writes_.emplace(write.id, std::move(write));
  return out;
}

// ---------------------------------------------------------------- commit, abort

Status InProcessController::CommitWrite(const CommitWriteRequest& request) {
  const WriteId id = request.write_id;
  MutexLock lock(&mu_);
  SLUICE_RETURN_IF_ERROR(CheckOpenLocked());
  ExpireLocked();
  auto it = writes_.find(id);
  if (it == writes_.end()) {
    return Status::NotFound("cannot commit write " + std::to_string(id) +
                            ": it is not open (committed, aborted, or never begun)");
  }
  OpenWrite& write = it->second;
  std::vector<Row*> rows;
  for (RowId row_id : write.rows) {
    auto row = rows_.find(row_id);
    if (row == rows_.end()) {
      return Status::NotFound("cannot commit write " + std::to_string(id) + ": " + RowName(row_id) +
                              " was cleared before the write committed (discard its bytes, then abort the write)");
    }
    rows.push_back(&row->second);
  }
  size_t i = 0;
  MutateRowsLocked(rows, [&](Row& row) SLUICE_REQUIRES(mu_) {
    SLUICE_CHECK_EQ(row.writing & write.mask, write.mask);
    row.writing &= ~write.mask;
    row.committed |= write.mask;
    row.bytes += write.row_bytes[i];
    if (!write.patches.empty()) {
      const RowTagPatch& patch = write.patches[i];
      if (patch.policy_version) row.tags.policy_version = *patch.policy_version;
      if (patch.token_length) row.tags.token_length = *patch.token_length;
      for (const auto& [k, v] : patch.user) row.tags.user[k] = v;
    }
    if (!row.visible) {
      row.visible = true;
      CountRowLocked(row, +1);
    }
    ++i;
  });
  bytes_reserved_ -= write.reserved;
  bytes_committed_ += write.reserved;
  ++counters_.writes_committed;
  writes_.erase(it);
  SignalReadyLocked();
  return Status::Ok();
}

Status InProcessController::AbortWrite(const AbortWriteRequest& request) {
  const WriteId id = request.write_id;
  MutexLock lock(&mu_);
  SLUICE_RETURN_IF_ERROR(CheckOpenLocked());
  auto it = writes_.find(id);
  if (it == writes_.end()) {
    return Status::NotFound("cannot abort write " + std::to_string(id) +
                            ": it is not open (committed, aborted, or never begun)");
  }
  const OpenWrite& write = it->second;
  for (size_t i = 0; i < write.rows.size(); ++i) {
    auto row = rows_.find(write.rows[i]);
    if (row == rows_.end()) continue;  // cleared meanwhile
    if (write.creates[i]) {
      // Never visible: in no view and no task count. Forget it entirely, as
      // if it had never been created (its group shrinks back).
      Row& r = row->second;
      Partition& partition = *r.partition;
      if (r.tags.group_id != kNoGroup) {
        Group& group = partition.groups.at(r.tags.group_id);
        --group.created;
      }
      FreeRowLocked(r, nullptr, /*partition_dying=*/false);
    } else {
      row->second.writing &= ~write.mask;
    }
  }
  bytes_reserved_ -= write.reserved;
  ++counters_.writes_aborted;
  writes_.erase(it);
  space_cv_.NotifyAll();
  return Status::Ok();
}

// ---------------------------------------------------------------- clear

Result<ClearResponse> InProcessController::ClearPartition(const ClearPartitionRequest& request) {
  const std::string& id = request.partition;
  SLUICE_RETURN_IF_ERROR(ValidateName("partition", id));
  MutexLock lock(&mu_);
  SLUICE_RETURN_IF_ERROR(CheckOpenLocked());
  ExpireLocked();
  SLUICE_ASSIGN_OR_RETURN(Partition * partition, FindPartitionLocked(id));
  ClearResponse out;
  const std::vector<RowId> ids(partition->rows.begin(), partition->rows.end());
  for (RowId row : ids) FreeRowLocked(rows_.at(row), &out.reclaim, /*partition_dying=*/true);
  out.rows_cleared = ids.size();
  partitions_.erase(partitions_.find(id));
  OpenTicketLocked(&out.reclaim);
  SignalReadyLocked();  // GetMeta waiters on this partition must learn it is gone
  space_cv_.NotifyAll();
  return out;
}

// ---------------------------------------------------------------- key-value

Result<std::vector<KvEntry>> InProcessController::KvLookup(const KvLookupRequest& request) {
  const std::string& partition_id = request.partition;
  const std::vector<std::string>& keys = request.keys;
  SLUICE_RETURN_IF_ERROR(ValidateName("partition", partition_id));
  for (const std::string& key : keys) SLUICE_RETURN_IF_ERROR(ValidateName("key", key));
  MutexLock lock(&mu_);
  SLUICE_RETURN_IF_ERROR(CheckOpenLocked());
  ExpireLocked();
  SLUICE_ASSIGN_OR_RETURN(Partition * partition, FindPartitionLocked(partition_id));
  std::vector<KvEntry> out;
  for (const std::string& key : keys) {
    auto it = partition->keys.find(key);
    if (it == partition->keys.end() || !rows_.at(it->second).visible) {
      return Status::NotFound("key " + Quoted(key) + " not found in partition " + Quoted(partition_id));
    }
    out.push_back(MakeKvEntryLocked(rows_.at(it->second)));
  }
  return out;
}

Result<std::vector<KvEntry>> InProcessController::KvList(const KvListRequest& request) {
  const std::string& partition_id = request.partition;
  SLUICE_RETURN_IF_ERROR(ValidateName("partition", partition_id));
  MutexLock lock(&mu_);
  SLUICE_RETURN_IF_ERROR(CheckOpenLocked());
  ExpireLocked();
  SLUICE_ASSIGN_OR_RETURN(Partition * partition, FindPartitionLocked(partition_id));
  std::map<std::string_view, const Row*> sorted;
  for (const auto& [key, id] : partition->keys) {
    const Row& row = rows_.at(id);
    if (row.visible) sorted.emplace(key, &row);
  }
  std::vector<KvEntry> out;
  for (const auto& [key, row] : sorted) out.push_back(MakeKvEntryLocked(*row));
  return out;
}

Result<ClearResponse> InProcessController::KvClear(const KvClearRequest& request) {
  const std::string& partition_id = request.partition;
  const std::vector<std::string>& keys = request.keys;
  SLUICE_RETURN_IF_ERROR(ValidateName("partition", partition_id));
  if (keys.empty()) return Status::InvalidArgument("KvClear: no keys");
  std::set<std::string_view> unique;
  for (const std::string& key : keys) {
    SLUICE_RETURN_IF_ERROR(ValidateName("key", key));
    if (!unique.insert(key).second) return Status::InvalidArgument("KvClear: key " + Quoted(key) + " appears twice");
  }
  MutexLock lock(&mu_);
  SLUICE_RETURN_IF_ERROR(CheckOpenLocked());
  ExpireLocked();
  SLUICE_ASSIGN_OR_RETURN(Partition * partition, FindPartitionLocked(partition_id));
  std::vector<RowId> ids;
  for (const std::string& key : keys) {
    auto it = partition->keys.find(key);
    if (it == partition->keys.end() || !rows_.at(it->second).visible) {
      return Status::NotFound("KvClear: key " + Quoted(key) + " not found in partition " + Quoted(partition_id) +
                              " (nothing was cleared)");
    }
    ids.push_back(it->second);
  }
  ClearResponse out;
  for (RowId id : ids) FreeRowLocked(rows_.at(id), &out.reclaim, /*partition_dying=*/false);
  out.rows_cleared = ids.size();
  OpenTicketLocked(&out.reclaim);
  SignalReadyLocked();
  space_cv_.NotifyAll();
  return out;
}

}  // namespace sluice::transfer_queue::internal
