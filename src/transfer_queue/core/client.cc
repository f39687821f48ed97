// The client orchestrates the two planes; see client.h for the contract.
#include "sluice/transfer_queue/client.h"

#include <algorithm>
#include <set>
#include <utility>

#include "core/validation.h"
#include "sluice/common/check.h"
#include "sluice/common/logging.h"

namespace sluice::transfer_queue {

using sluice::Quoted;

namespace {

std::string JoinNames(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + Quoted(n);
  return out.empty() ? "none" : out;
}

}  // namespace

TransferQueueClient::TransferQueueClient(std::shared_ptr<Controller> controller,
                                         std::vector<std::shared_ptr<StorageUnit>> storage,
                                         std::shared_ptr<FusedCalls> fused)
    : controller_(std::move(controller)), storage_(std::move(storage)), fused_(std::move(fused)) {
  SLUICE_CHECK(controller_ != nullptr) << "TransferQueueClient needs a controller";
  SLUICE_CHECK(!storage_.empty()) << "TransferQueueClient needs at least one storage unit";
  for (const auto& unit : storage_) SLUICE_CHECK(unit != nullptr) << "null storage unit";
}

Status TransferQueueClient::RegisterColumns(std::vector<ColumnSchema> columns) {
  return controller_->RegisterColumns(RegisterColumnsRequest{std::move(columns)});
}

Status TransferQueueClient::RegisterTask(std::string task) {
  return controller_->RegisterTask(RegisterTaskRequest{std::move(task)});
}

Status TransferQueueClient::CreatePartition(std::string partition, uint32_t group_size,
                                            std::vector<std::string> consumers) {
  return controller_->CreatePartition(CreatePartitionRequest{std::move(partition), group_size, std::move(consumers)})
      .status();
}

Result<std::vector<RowId>> TransferQueueClient::CreateRows(std::string partition, std::vector<RowTags> tags,
                                                           CapacityWait wait) {
  CreateRowsRequest request;
  request.partition = std::move(partition);
  request.rows = std::move(tags);
  request.wait = wait;
  SLUICE_ASSIGN_OR_RETURN(CreateRowsResponse response, controller_->CreateRows(request));
  return std::move(response.rows);
}

Status TransferQueueClient::PutColumns(const std::vector<RowId>& rows, const ColumnBatch& columns,
                                       std::vector<RowTagPatch> patches, CapacityWait wait) {
  BeginWriteRequest begin;
  begin.target = WriteTarget::kExistingRows;
  begin.rows = rows;
  begin.patches = std::move(patches);
  begin.wait = wait;
  return Write(std::move(begin), columns, rows.size()).status();
}

Result<std::vector<RowId>> TransferQueueClient::PutRows(std::string partition, std::vector<RowTags> tags,
                                                        const ColumnBatch& columns, CapacityWait wait) {
  BeginWriteRequest begin;
  begin.partition = std::move(partition);
  begin.target = WriteTarget::kNewRows;
  const size_t n = tags.size();
  begin.new_rows = std::move(tags);
  begin.wait = wait;
  return Write(std::move(begin), columns, n);
}

Result<std::vector<RowId>> TransferQueueClient::Write(BeginWriteRequest begin, const ColumnBatch& columns,
                                                      size_t num_rows) {
  uint64_t payload_bytes = 0;
  for (const auto& [name, tensors] : columns) {
    if (tensors.size() != num_rows) {
      return Status::InvalidArgument("column " + Quoted(name) + " has " + std::to_string(tensors.size()) +
                                     " tensors for " + std::to_string(num_rows) + " rows");
    }
    ColumnWriteMeta meta{name, {}};
    meta.rows.reserve(tensors.size());
    for (const HostTensor& t : tensors) {
      meta.rows.push_back(TensorMeta{t.dtype, t.shape, t.nbytes});
      payload_bytes += t.nbytes;
    }
    begin.columns.push_back(std::move(meta));
  }
  if (fused_) {
    // One round trip where the transport can (all or nothing there too).
    if (std::optional<Result<BeginWriteResponse>> done = fused_->Put(begin, columns, payload_bytes)) {
      SLUICE_ASSIGN_OR_RETURN(BeginWriteResponse written, std::move(*done));
      return std::move(written.rows);
    }
  }
  // Phase one: validation and reservation; nothing is stored yet.
  SLUICE_ASSIGN_OR_RETURN(BeginWriteResponse write, controller_->BeginWrite(begin));

  // Bytes to the storage units, sharded by row.
  const uint32_t units = static_cast<uint32_t>(storage_.size());
  std::vector<StorageWriteRequest> shards(units);
  for (auto& shard : shards) shard.write_id = write.write_id;
  for (const auto& [name, tensors] : columns) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      shards[StorageUnitFor(write.rows[i], units)].items.push_back(StorageItem{write.rows[i], name, tensors[i]});
    }
  }
  for (uint32_t u = 0; u < units; ++u) {
    if (shards[u].items.empty()) continue;
    Status stored = storage_[u]->Write(shards[u]);
    if (!stored.ok()) return Undo(write.write_id, write.rows, columns, stored);
  }
  // Phase two: visible all at once.
  Status committed = controller_->CommitWrite(CommitWriteRequest{write.write_id});
  if (!committed.ok()) return Undo(write.write_id, write.rows, columns, committed);
  return std::move(write.rows);
}

Status TransferQueueClient::Undo(WriteId write, const std::vector<RowId>& rows, const ColumnBatch& columns,
                                 const Status& cause) {
  // Discard before abort: the reservation must cover the bytes until they
  // are gone from storage.
  const uint32_t units = static_cast<uint32_t>(storage_.size());
  std::vector<StorageDiscardRequest> shards(units);
  for (auto& [name, tensors] : columns) {
    for (auto& shard : shards) shard.columns.push_back(name);
  }
  for (RowId row : rows) shards[StorageUnitFor(row, units)].rows.push_back(row);
  for (uint32_t u = 0; u < units; ++u) {
    if (shards[u].rows.empty() || shards[u].columns.empty()) continue;
    Status s = storage_[u]->Discard(shards[u]);
    if (!s.ok()) SLUICE_LOG(ERROR) << "write " << write << ": discarding stored bytes failed: " << s.ToString();
  }
  Status aborted = controller_->AbortWrite(AbortWriteRequest{write});
  if (!aborted.ok()) SLUICE_LOG(ERROR) << "write " << write << ": abort failed: " << aborted.ToString();
  return cause.WithContext("write " + std::to_string(write) + " rolled back");
}

Result<BatchMeta> TransferQueueClient::GetMeta(const GetMetaRequest& request) { return controller_->GetMeta(request); }

Result<BatchMeta> TransferQueueClient::GetMeta(std::string task, std::vector<std::string> columns, uint32_t n,
                                               std::string partition, SamplingPolicy policy,
                                               std::chrono::milliseconds timeout) {
  GetMetaRequest request;
  request.task = std::move(task);
  request.columns = std::move(columns);
  request.n = n;
  request.partition = std::move(partition);
  request.policy = policy;
  request.timeout = timeout;
  return controller_->GetMeta(request);
}

Result<BatchData> TransferQueueClient::GetData(const BatchMeta& meta, const std::vector<std::string>& columns) {
  const std::string what = "GetData(lease " + std::to_string(meta.lease_id) + ")";
  const std::vector<std::string>& wanted = columns.empty() ? meta.columns : columns;
  std::set<std::string_view> batch_columns(meta.columns.begin(), meta.columns.end());
  std::set<std::string_view> seen;
  for (const std::string& c : wanted) {
    if (batch_columns.count(c) == 0) {
      return Status::InvalidArgument(what + ": column " + Quoted(c) +
                                     " is not in the batch (its columns: " + JoinNames(meta.columns) + ")");
    }
    if (!seen.insert(c).second) return Status::InvalidArgument(what + ": column " + Quoted(c) + " is listed twice");
  }
  BatchData out;
  out.rows = meta.row_ids();
  Result<ColumnBatch> read = ReadColumns(out.rows, wanted);
  if (!read.ok()) return read.status().WithContext(what);
  out.columns = std::move(read).value();
  return out;
}

Result<ColumnBatch> TransferQueueClient::ReadColumns(const std::vector<RowId>& rows,
                                                     const std::vector<std::string>& columns) {
  const uint32_t units = static_cast<uint32_t>(storage_.size());
  std::vector<StorageReadRequest> shards(units);
  std::vector<std::vector<size_t>> positions(units);  // index into `rows` of each shard row
  for (size_t i = 0; i < rows.size(); ++i) {
    const uint32_t u = StorageUnitFor(rows[i], units);
    shards[u].rows.push_back(rows[i]);
    positions[u].push_back(i);
  }
  ColumnBatch out;
  for (const std::string& c : columns) out[c].resize(rows.size());
  for (uint32_t u = 0; u < units; ++u) {
    if (shards[u].rows.empty()) continue;
    shards[u].columns = columns;
    SLUICE_ASSIGN_OR_RETURN(StorageReadResponse response, storage_[u]->Read(shards[u]));
    for (size_t c = 0; c < columns.size(); ++c) {
      std::vector<HostTensor>& dest = out[columns[c]];
      for (size_t j = 0; j < positions[u].size(); ++j) dest[positions[u][j]] = std::move(response.tensors[c][j]);
    }
  }
  return out;
}

Status TransferQueueClient::Reclaim(const ReclaimTicket& ticket) {
  if (ticket.id == 0) return Status::Ok();
  const uint32_t units = static_cast<uint32_t>(storage_.size());
  std::vector<StorageFreeRequest> shards(units);
  for (RowId row : ticket.rows) shards[StorageUnitFor(row, units)].rows.push_back(row);
  for (uint32_t u = 0; u < units; ++u) {
    if (!shards[u].rows.empty()) SLUICE_RETURN_IF_ERROR(storage_[u]->FreeRows(shards[u]));
  }
  return controller_->FinishReclaim(FinishReclaimRequest{ticket.id});
}

Result<TakenBatch> TransferQueueClient::Take(const GetMetaRequest& request, const std::vector<std::string>& columns,
                                             LeaseId ack_first) {
  std::set<std::string_view> seen;
  for (const std::string& c : columns) {
    if (!seen.insert(c).second) return Status::InvalidArgument("Take: column " + Quoted(c) + " is listed twice");
  }
  if (fused_) return fused_->Take(request, columns, ack_first);
  if (ack_first != 0) {
    Result<AckResponse> acked = Ack(ack_first);
    if (!acked.ok()) {
      return acked.status().WithContext("ack of lease " + std::to_string(ack_first) +
                                        " before the take (nothing taken)");
    }
  }
  TakenBatch out;
  SLUICE_ASSIGN_OR_RETURN(out.meta, controller_->GetMeta(request));
  Result<BatchData> data = GetData(out.meta, columns);
  if (!data.ok()) {
    (void)controller_->Release(ReleaseRequest{out.meta.lease_id});
    return data.status();
  }
  out.data = std::move(data).value();
  return out;
}

Result<AckResponse> TransferQueueClient::Ack(LeaseId lease) {
  SLUICE_ASSIGN_OR_RETURN(AckResponse response, controller_->Ack(AckRequest{lease}));
  // The ack itself is done; a failed reclaim only delays freeing bytes.
  Status reclaimed = Reclaim(response.reclaim);
  if (!reclaimed.ok()) SLUICE_LOG(ERROR) << "ack of lease " << lease << ": reclaim failed: " << reclaimed.ToString();
  return response;
}

Result<ReleaseResponse> TransferQueueClient::Release(LeaseId lease) {
  return controller_->Release(ReleaseRequest{lease});
}

Result<ReleaseHolderResponse> TransferQueueClient::ReleaseHolder(const std::string& holder) {
  return controller_->ReleaseHolder(ReleaseHolderRequest{holder});
}

Result<RenewResponse> TransferQueueClient::Renew(LeaseId lease, std::chrono::milliseconds lease_timeout) {
  return controller_->Renew(RenewRequest{lease, lease_timeout});
}

Result<ClearResponse> TransferQueueClient::ClearPartition(std::string partition) {
  SLUICE_ASSIGN_OR_RETURN(ClearResponse response, controller_->ClearPartition(ClearPartitionRequest{partition}));
  Status reclaimed = Reclaim(response.reclaim);
  if (!reclaimed.ok()) {
    SLUICE_LOG(ERROR) << "clear of partition " << Quoted(partition) << ": reclaim failed: " << reclaimed.ToString();
  }
  return response;
}

Status TransferQueueClient::KvPut(std::string partition, std::string key, RowTags tags,
                                  const std::map<std::string, HostTensor>& columns, CapacityWait wait) {
  BeginWriteRequest begin;
  begin.partition = std::move(partition);
  begin.target = WriteTarget::kKeys;
  begin.keys.push_back(std::move(key));
  RowTagPatch patch;
  patch.policy_version = tags.policy_version;
  patch.token_length = tags.token_length;
  patch.user = tags.user;
  begin.patches.push_back(std::move(patch));
  begin.new_rows.push_back(std::move(tags));
  begin.wait = wait;
  ColumnBatch batch;
  for (const auto& [name, tensor] : columns) batch[name].push_back(tensor);
  return Write(std::move(begin), batch, 1).status();
}

Result<KvValue> TransferQueueClient::KvGet(std::string partition, std::string key,
                                           const std::vector<std::string>& columns) {
  SLUICE_ASSIGN_OR_RETURN(std::vector<KvEntry> entries, controller_->KvLookup(KvLookupRequest{partition, {key}}));
  KvValue out;
  out.entry = std::move(entries.at(0));
  const std::vector<std::string>& wanted = columns.empty() ? out.entry.columns : columns;
  std::set<std::string_view> have(out.entry.columns.begin(), out.entry.columns.end());
  std::set<std::string_view> seen;
  for (const std::string& c : wanted) {
    if (have.count(c) == 0) {
      return Status::NotFound("key " + Quoted(key) + " in partition " + Quoted(partition) + " has no column " +
                              Quoted(c) + " (its columns: " + JoinNames(out.entry.columns) + ")");
    }
    if (!seen.insert(c).second) return Status::InvalidArgument("KvGet: column " + Quoted(c) + " is listed twice");
  }
  Result<ColumnBatch> read = ReadColumns({out.entry.row}, wanted);
  if (!read.ok()) return read.status().WithContext("KvGet(key " + Quoted(key) + ")");
  for (auto& [name, tensors] : *read) out.columns.emplace(name, std::move(tensors.at(0)));
  return out;
}

Status TransferQueueClient::KvPutBatch(std::string partition, std::vector<std::string> keys, std::vector<RowTags> tags,
                                       const ColumnBatch& columns, std::vector<RowTagPatch> patches,
                                       CapacityWait wait) {
  const size_t n = keys.size();
  if (!tags.empty() && tags.size() != n) {
    return Status::InvalidArgument("KvPutBatch: " + std::to_string(tags.size()) + " tags for " + std::to_string(n) +
                                   " keys");
  }
  if (tags.empty()) tags.resize(n);
  BeginWriteRequest begin;
  begin.partition = std::move(partition);
  begin.target = WriteTarget::kKeys;
  begin.keys = std::move(keys);
  begin.new_rows = std::move(tags);
  begin.patches = std::move(patches);
  begin.wait = wait;
  return Write(std::move(begin), columns, n).status();
}

Result<KvBatch> TransferQueueClient::KvGetBatch(std::string partition, std::vector<std::string> keys,
                                                const std::vector<std::string>& columns) {
  if (keys.empty()) return Status::InvalidArgument("KvGetBatch: no keys");
  std::set<std::string_view> unique_keys;
  for (const std::string& key : keys) {
    if (!unique_keys.insert(key).second) {
      return Status::InvalidArgument("KvGetBatch: key " + Quoted(key) + " is listed twice");
    }
  }
  KvBatch out;
  SLUICE_ASSIGN_OR_RETURN(out.entries, controller_->KvLookup(KvLookupRequest{partition, std::move(keys)}));
  std::vector<std::string> wanted = columns;
  if (wanted.empty() && !out.entries.empty()) {
    // The columns every key has, in the first entry's (registration) order.
    for (const std::string& c : out.entries.front().columns) {
      bool everywhere = true;
      for (const KvEntry& e : out.entries) {
        everywhere = everywhere && std::find(e.columns.begin(), e.columns.end(), c) != e.columns.end();
      }
      if (everywhere) wanted.push_back(c);
    }
  }
  std::set<std::string_view> seen;
  for (const std::string& c : wanted) {
    if (!seen.insert(c).second) return Status::InvalidArgument("KvGetBatch: column " + Quoted(c) + " is listed twice");
    for (const KvEntry& e : out.entries) {
      if (std::find(e.columns.begin(), e.columns.end(), c) == e.columns.end()) {
        return Status::NotFound("key " + Quoted(e.key) + " in partition " + Quoted(partition) + " has no column " +
                                Quoted(c) + " (its columns: " + JoinNames(e.columns) + ")");
      }
    }
  }
  std::vector<RowId> rows;
  rows.reserve(out.entries.size());
  for (const KvEntry& e : out.entries) rows.push_back(e.row);
  if (rows.empty() || wanted.empty()) return out;
  Result<ColumnBatch> read = ReadColumns(rows, wanted);
  if (!read.ok()) return read.status().WithContext("KvGetBatch");
  out.columns = std::move(read).value();
  return out;
}

Result<std::vector<KvEntry>> TransferQueueClient::KvList(std::string partition) {
  return controller_->KvList(KvListRequest{std::move(partition)});
}

Result<ClearResponse> TransferQueueClient::KvClear(std::string partition, std::vector<std::string> keys) {
  SLUICE_ASSIGN_OR_RETURN(ClearResponse response, controller_->KvClear(KvClearRequest{partition, keys}));
  Status reclaimed = Reclaim(response.reclaim);
  if (!reclaimed.ok()) SLUICE_LOG(ERROR) << "KvClear: reclaim failed: " << reclaimed.ToString();
  return response;
}

Result<QueueStats> TransferQueueClient::Stats() {
  QueueStats out;
  SLUICE_ASSIGN_OR_RETURN(out.controller, controller_->Stats());
  for (const auto& unit : storage_) {
    SLUICE_ASSIGN_OR_RETURN(StorageStats s, unit->Stats());
    out.storage_bytes += s.bytes;
    out.storage.push_back(s);
  }
  return out;
}

Result<std::unique_ptr<TransferQueueHub>> TransferQueueHub::Create(HubOptions options) {
  if (options.storage_units == 0) return Status::InvalidArgument("HubOptions.storage_units must be > 0");
  const uint64_t max_tensor_bytes = options.controller.max_tensor_bytes;
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<Controller> controller,
                          NewInProcessController(std::move(options.controller)));
  std::unique_ptr<TransferQueueHub> hub(new TransferQueueHub());
  hub->controller_ = std::move(controller);
  hub->meter_ = std::make_shared<StorageMeter>();
  for (uint32_t u = 0; u < options.storage_units; ++u) {
    hub->storage_.push_back(NewInProcessStorageUnit(StorageUnitOptions{u, max_tensor_bytes, hub->meter_, nullptr}));
  }
  return hub;
}

}  // namespace sluice::transfer_queue
