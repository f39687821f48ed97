// Runs one decoded request against the served controller and storage units
// (worker threads). What differs from calling them in process:
//  * rows freed by Ack/ClearPartition/KvClear are reclaimed here at once (the
//    server holds both planes), so replies carry an empty ReclaimTicket;
//  * writes are tracked in OpenWrites: storage writes must match a declared
//    cell, AbortWrite discards the write's bytes itself, remote Discard only
//    touches open writes, remote FreeRows is refused (see server.h).
#include <algorithm>

#include "net/server_impl.h"
#include "sluice/common/logging.h"

namespace sluice::transfer_queue {

using wire::MessageType;
using Steady = std::chrono::steady_clock;

wire::Message TransferQueueServer::Impl::ErrorTo(const Job& job, const Status& status) {
  counters_.error_replies.fetch_add(1);
  return wire::EncodeErrorReply(job.header.type, job.header.request_id, status);
}

wire::Message TransferQueueServer::Impl::ReplyTo(const Job& job, const Status& status) {
  if (!status.ok()) return ErrorTo(job, status);
  return wire::EncodeReply(job.header.type, job.header.request_id, wire::Empty{});
}

template <typename T>
wire::Message TransferQueueServer::Impl::ReplyTo(const Job& job, const Result<T>& result) {
  if (!result.ok()) return ErrorTo(job, result.status());
  // Lease deadlines are on the controller's clock: encode against it.
  return wire::EncodeReply(job.header.type, job.header.request_id, *result, clock_->Now());
}

template <typename Req, typename Fn>
wire::Message TransferQueueServer::Impl::Serve(const Job& job, Fn&& fn) {
  Req request{};
  std::string token;
  // Tensors decode as views into the received frame (the storage unit copies them).
  Status decoded = wire::DecodeRequest(job.bytes(), job.header, limits_, job.owner, Steady::now(), &token, &request);
  if (!decoded.ok()) {
    counters_.malformed.fetch_add(1);
    SLUICE_LOG(DEBUG) << "TransferQueue server: malformed request: " << decoded.ToString();
    return ErrorTo(job, decoded);
  }
  counters_.requests.fetch_add(1);
  return ReplyTo(job, fn(request));
}

void TransferQueueServer::Impl::DiscardCells(const internal::WriteCells& cells) {
  if (cells.columns.empty()) return;
  const uint32_t n = static_cast<uint32_t>(units_.size());
  std::vector<StorageDiscardRequest> shards(n);
  for (RowId row : cells.rows) shards[StorageUnitFor(row, n)].rows.push_back(row);
  for (uint32_t u = 0; u < n; ++u) {
    if (shards[u].rows.empty()) continue;
    shards[u].columns = cells.columns;
    Status s = units_[u]->Discard(shards[u]);
    if (!s.ok()) SLUICE_LOG(ERROR) << "TransferQueue server: discard failed: " << s.ToString();
  }
}

void TransferQueueServer::Impl::ReclaimNow(ReclaimTicket* ticket) {
  if (ticket->id != 0) {
    const uint32_t n = static_cast<uint32_t>(units_.size());
    std::vector<StorageFreeRequest> shards(n);
    for (RowId row : ticket->rows) shards[StorageUnitFor(row, n)].rows.push_back(row);
    Status freed = Status::Ok();
    for (uint32_t u = 0; u < n && freed.ok(); ++u) {
      if (!shards[u].rows.empty()) freed = units_[u]->FreeRows(shards[u]);
    }
    // Only tell the controller once the bytes are gone (they stay counted
    // until then, so storage never exceeds the accounting).
    if (freed.ok()) freed = controller_->FinishReclaim(FinishReclaimRequest{ticket->id});
    if (!freed.ok()) {
      SLUICE_LOG(ERROR) << "TransferQueue server: reclaim " << ticket->id << " failed: " << freed.ToString();
    }
  }
  *ticket = ReclaimTicket{};
}

namespace {
Status NoArena() {
  return Status::FailedPrecondition(
      "this TransferQueue server has no shared-memory arena (start it with --shm-bytes / ServerOptions::shm_bytes)");
}
}  // namespace

Result<wire::ShmWriteReply> TransferQueueServer::Impl::ShmWrite(const wire::ShmWriteRequest& request, uint32_t unit) {
  if (!arena_) return NoArena();
  // Check the cells against the open write first (metadata only), then
  // allocate: a client can only take arena space its BeginWrite reserved.
  StorageWriteRequest write{request.write_id, {}};
  write.items.reserve(request.items.size());
  for (const wire::ShmWriteItem& item : request.items) {
    HostTensor declared;
    declared.dtype = item.meta.dtype;
    declared.shape = item.meta.shape;
    declared.nbytes = item.meta.nbytes;
    write.items.push_back(StorageItem{item.row, item.column, std::move(declared)});
  }
  wire::ShmWriteReply reply;
  Status stored = open_writes_->Store(
      write, unit,
      [&]() -> Status {
        for (StorageItem& item : write.items) {
          HostTensor& t = item.tensor;
          SLUICE_ASSIGN_OR_RETURN(t, arena_->Allocate(t.dtype, std::move(t.shape), t.nbytes));
          reply.offsets.push_back(arena_->OffsetOf(t.data));
        }
        // The unit adopts the blocks (no copy); the client fills them before
        // CommitWrite, and nobody reads them before that commit.
        return units_[unit]->Write(write);
      },
      Steady::now());
  if (!stored.ok()) return stored;  // the allocated blocks are freed with `write`
  return reply;
}

Result<wire::ShmReadReply> TransferQueueServer::Impl::ShmRead(const StorageReadRequest& request, uint32_t unit) {
  if (!arena_) return NoArena();
  // The client pinned the arena before sending this, so these blocks are not
  // reused after the views below are dropped, until it unpins.
  SLUICE_ASSIGN_OR_RETURN(StorageReadResponse read, units_[unit]->Read(request));
  wire::ShmReadReply reply;
  reply.cells.resize(read.tensors.size());
  for (size_t c = 0; c < read.tensors.size(); ++c) {
    for (const HostTensor& t : read.tensors[c]) {
      if (!arena_->Contains(t.data)) return Status::Internal("a stored cell lies outside the shared-memory arena");
      reply.cells[c].push_back(wire::ShmCell{arena_->OffsetOf(t.data), TensorMeta{t.dtype, t.shape, t.nbytes}});
    }
  }
  return reply;
}

Result<BeginWriteResponse> TransferQueueServer::Impl::Put(const wire::PutRequest& r) {
  const BeginWriteRequest& begin = r.begin;
  if (r.data.size() != begin.columns.size()) {
    return Status::InvalidArgument("PutRows: data for " + std::to_string(r.data.size()) +
                                   " columns, the write declares " + std::to_string(begin.columns.size()));
  }
  for (size_t c = 0; c < r.data.size(); ++c) {
    if (r.data[c].size() != begin.columns[c].rows.size()) {
      return Status::InvalidArgument("PutRows: column '" + begin.columns[c].column + "' has " +
                                     std::to_string(r.data[c].size()) + " tensors, the write declares " +
                                     std::to_string(begin.columns[c].rows.size()));
    }
  }
  SLUICE_ASSIGN_OR_RETURN(BeginWriteResponse write, controller_->BeginWrite(begin));
  const Steady::time_point now = Steady::now();
  open_writes_->Add(write.write_id, begin, write.rows, now);
  const uint32_t n = static_cast<uint32_t>(units_.size());
  std::vector<StorageWriteRequest> shards(n);
  for (auto& shard : shards) shard.write_id = write.write_id;
  Status done = Status::Ok();
  for (size_t c = 0; c < r.data.size() && done.ok(); ++c) {
    if (r.data[c].size() != write.rows.size()) {
      done = Status::InvalidArgument("PutRows: " + std::to_string(r.data[c].size()) + " tensors for " +
                                     std::to_string(write.rows.size()) + " rows");
      break;
    }
    for (size_t i = 0; i < write.rows.size(); ++i) {
      shards[StorageUnitFor(write.rows[i], n)].items.push_back(
          StorageItem{write.rows[i], begin.columns[c].column, r.data[c][i]});
    }
  }
  // The open write checks each cell against the declared one, as for a
  // client's StorageWrite; the units copy the bytes (into the arena if any).
  for (uint32_t u = 0; u < n && done.ok(); ++u) {
    if (shards[u].items.empty()) continue;
    done = open_writes_->Store(
        shards[u], u, [&] { return units_[u]->Write(shards[u]); }, now);
  }
  if (done.ok()) {
    done = open_writes_->Commit(
        write.write_id, [&] { return controller_->CommitWrite(CommitWriteRequest{write.write_id}); }, now);
  }
  if (done.ok()) return write;
  Status aborted = open_writes_->Abort(write.write_id, [&](const internal::WriteCells* cells) {
    if (cells != nullptr) DiscardCells(*cells);
    return controller_->AbortWrite(AbortWriteRequest{write.write_id});
  });
  if (!aborted.ok())
    SLUICE_LOG(ERROR) << "TransferQueue server: abort of write " << write.write_id << ": " << aborted.ToString();
  return done.WithContext("write " + std::to_string(write.write_id) + " rolled back");
}

Result<wire::TakeReply> TransferQueueServer::Impl::Take(const wire::TakeRequest& r) {
  if (r.in_place && !arena_) return NoArena();
  if (r.ack != 0) {
    Result<AckResponse> acked = controller_->Ack(AckRequest{r.ack});
    if (!acked.ok()) {
      return acked.status().WithContext("ack of lease " + std::to_string(r.ack) + " before the take (nothing taken)");
    }
    ReclaimNow(&acked->reclaim);
  }
  wire::TakeReply reply;
  SLUICE_ASSIGN_OR_RETURN(reply.meta, controller_->GetMeta(r.get));
  // Whatever goes wrong from here, the rows go back to the queue.
  auto give_back = [&](const Status& why) {
    (void)controller_->Release(ReleaseRequest{reply.meta.lease_id});
    return why.WithContext("TakeBatch (lease " + std::to_string(reply.meta.lease_id) + " released)");
  };
  const std::vector<std::string>& columns = r.columns.empty() ? reply.meta.columns : r.columns;
  for (size_t c = 0; c < columns.size(); ++c) {
    if (std::find(reply.meta.columns.begin(), reply.meta.columns.end(), columns[c]) == reply.meta.columns.end()) {
      return give_back(Status::InvalidArgument("column '" + columns[c] + "' is not in the batch"));
    }
    if (std::find(columns.begin(), columns.begin() + c, columns[c]) != columns.begin() + c) {
      return give_back(Status::InvalidArgument("column '" + columns[c] + "' is listed twice"));
    }
  }
  const uint32_t n = static_cast<uint32_t>(units_.size());
  const size_t rows = reply.meta.rows.size();
  std::vector<StorageReadRequest> shards(n);
  std::vector<std::vector<size_t>> positions(n);
  for (size_t i = 0; i < rows; ++i) {
    const uint32_t u = StorageUnitFor(reply.meta.rows[i].id, n);
    shards[u].rows.push_back(reply.meta.rows[i].id);
    positions[u].push_back(i);
  }
  reply.in_place = r.in_place;
  if (r.in_place) {
    reply.cells.assign(columns.size(), std::vector<wire::ShmCell>(rows));
  } else {
    reply.data.assign(columns.size(), std::vector<HostTensor>(rows));
  }
  for (uint32_t u = 0; u < n; ++u) {
    if (shards[u].rows.empty()) continue;
    shards[u].columns = columns;
    if (r.in_place) {
      Result<wire::ShmReadReply> read = ShmRead(shards[u], u);
      if (!read.ok()) return give_back(read.status());
      for (size_t c = 0; c < columns.size(); ++c) {
        for (size_t j = 0; j < positions[u].size(); ++j) reply.cells[c][positions[u][j]] = read->cells[c][j];
      }
    } else {
      Result<StorageReadResponse> read = units_[u]->Read(shards[u]);
      if (!read.ok()) return give_back(read.status());
      for (size_t c = 0; c < columns.size(); ++c) {
        for (size_t j = 0; j < positions[u].size(); ++j) {
          reply.data[c][positions[u][j]] = std::move(read->tensors[c][j]);
        }
      }
    }
  }
  return reply;
}

Status TransferQueueServer::Impl::DeclareElsewhere(WriteId id, const BeginWriteRequest& request,
                                                   const std::vector<RowId>& rows) {
  if (hosts_.empty() || request.columns.empty()) return Status::Ok();
  const uint32_t n = static_cast<uint32_t>(units_.size());
  wire::DeclareWriteRequest declare{id, rows, request.columns};
  for (const auto& link : hosts_) {
    const bool touches =
        std::any_of(rows.begin(), rows.end(), [&](RowId row) { return link->Holds(StorageUnitFor(row, n)); });
    if (touches) SLUICE_RETURN_IF_ERROR(link->Declare(declare));
  }
  return Status::Ok();
}

wire::Message TransferQueueServer::Impl::Execute(const Job& job) {
  Controller* c = controller_.get();  // null on a storage server
  StorageUnit* unit = wire::IsStorageMessage(job.header.type) ? units_[job.header.target].get() : nullptr;
  const uint32_t unit_index = job.header.target;
  const MessageType type = job.header.type;
  if (c == nullptr && !wire::IsStorageMessage(type) && type != MessageType::kServerInfo &&
      type != MessageType::kDeclareWrite) {
    return ErrorTo(job, Status::FailedPrecondition(
                            wire::MessageTypeName(type) + ": this TransferQueue server holds storage units " +
                            std::to_string(options_.first_unit) + ".." +
                            std::to_string(options_.first_unit + options_.unit_count - 1) +
                            " of a hub only; send controller requests to the hub's controller server"));
  }
  if ((type == MessageType::kPutRows || type == MessageType::kTakeBatch) && !hosts_.empty()) {
    return ErrorTo(job, Status::FailedPrecondition(wire::MessageTypeName(type) +
                                                   ": this hub has storage units on other hosts; put and take in "
                                                   "steps (BeginWrite, the storage servers, CommitWrite)"));
  }
  switch (type) {
    case MessageType::kServerInfo:
      return Serve<wire::Empty>(job, [&](const wire::Empty&) { return Result<wire::ServerInfo>(Info()); });
    case MessageType::kOpenRing:
      return Serve<wire::Empty>(job, [&](const wire::Empty&) { return OpenRing(); });
    case MessageType::kRegisterColumns:
      return Serve<RegisterColumnsRequest>(job, [&](const auto& r) { return c->RegisterColumns(r); });
    case MessageType::kRegisterTask:
      return Serve<RegisterTaskRequest>(job, [&](const auto& r) { return c->RegisterTask(r); });
    case MessageType::kDescribe:
      return Serve<wire::Empty>(job, [&](const wire::Empty&) { return c->Describe(); });
    case MessageType::kCreatePartition:
      return Serve<CreatePartitionRequest>(job, [&](const auto& r) { return c->CreatePartition(r); });
    case MessageType::kCreateRows:
      return Serve<CreateRowsRequest>(job, [&](const auto& r) { return c->CreateRows(r); });
    case MessageType::kBeginWrite:
      return Serve<BeginWriteRequest>(job, [&](const BeginWriteRequest& r) {
        Result<BeginWriteResponse> begun = c->BeginWrite(r);
        if (!begun.ok()) return begun;
        open_writes_->Add(begun->write_id, r, begun->rows, Steady::now());
        if (Status declared = DeclareElsewhere(begun->write_id, r, begun->rows); !declared.ok()) {
          // Not begun after all: its storage writes could not be checked there.
          (void)open_writes_->Abort(begun->write_id, [&](const internal::WriteCells* cells) {
            if (cells != nullptr) DiscardCells(*cells);
            return c->AbortWrite(AbortWriteRequest{begun->write_id});
          });
          return Result<BeginWriteResponse>(declared);
        }
        return begun;
      });
    case MessageType::kDeclareWrite:
      return Serve<wire::DeclareWriteRequest>(job, [&](const wire::DeclareWriteRequest& r) {
        if (!job.peer || c != nullptr) {
          return Status::FailedPrecondition(
              "DeclareWrite comes only from a hub's controller server to its storage servers");
        }
        BeginWriteRequest declared;
        declared.rows = r.rows;
        declared.columns = r.columns;
        for (const ColumnWriteMeta& column : declared.columns) {
          if (column.rows.size() != declared.rows.size()) {
            return Status::InvalidArgument("DeclareWrite " + std::to_string(r.write_id) + ": column '" + column.column +
                                           "' declares " + std::to_string(column.rows.size()) + " cells for " +
                                           std::to_string(declared.rows.size()) + " rows");
          }
        }
        open_writes_->Add(r.write_id, declared, declared.rows, Steady::now());
        return Status::Ok();
      });
    case MessageType::kCommitWrite:
      return Serve<CommitWriteRequest>(job, [&](const CommitWriteRequest& r) {
        return open_writes_->Commit(
            r.write_id, [&] { return c->CommitWrite(r); }, Steady::now());
      });
    case MessageType::kAbortWrite:
      return Serve<AbortWriteRequest>(job, [&](const AbortWriteRequest& r) {
        return open_writes_->Abort(r.write_id, [&](const internal::WriteCells* cells) {
          // Discard before abort: the reservation covers the bytes until gone.
          if (cells != nullptr) DiscardCells(*cells);
          return c->AbortWrite(r);
        });
      });
    case MessageType::kGetMeta:
      return Serve<GetMetaRequest>(job, [&](const auto& r) { return c->GetMeta(r); });
    case MessageType::kAck:
      return Serve<AckRequest>(job, [&](const AckRequest& r) {
        Result<AckResponse> acked = c->Ack(r);
        if (acked.ok()) ReclaimNow(&acked->reclaim);
        return acked;
      });
    case MessageType::kRelease:
      return Serve<ReleaseRequest>(job, [&](const auto& r) { return c->Release(r); });
    case MessageType::kRenew:
      return Serve<RenewRequest>(job, [&](const auto& r) { return c->Renew(r); });
    case MessageType::kReleaseHolder:
      return Serve<ReleaseHolderRequest>(job, [&](const auto& r) { return c->ReleaseHolder(r); });
    case MessageType::kClearPartition:
      return Serve<ClearPartitionRequest>(job, [&](const ClearPartitionRequest& r) {
        Result<ClearResponse> cleared = c->ClearPartition(r);
        if (cleared.ok()) ReclaimNow(&cleared->reclaim);
        return cleared;
      });
    case MessageType::kPutRows:
      return Serve<wire::PutRequest>(job, [&](const wire::PutRequest& r) { return Put(r); });
    case MessageType::kTakeBatch:
      return Serve<wire::TakeRequest>(job, [&](const wire::TakeRequest& r) { return Take(r); });
    case MessageType::kKvLookup:
      return Serve<KvLookupRequest>(job, [&](const auto& r) { return c->KvLookup(r); });
    case MessageType::kKvList:
      return Serve<KvListRequest>(job, [&](const auto& r) { return c->KvList(r); });
    case MessageType::kKvClear:
      return Serve<KvClearRequest>(job, [&](const KvClearRequest& r) {
        Result<ClearResponse> cleared = c->KvClear(r);
        if (cleared.ok()) ReclaimNow(&cleared->reclaim);
        return cleared;
      });
    case MessageType::kFinishReclaim:
      return Serve<FinishReclaimRequest>(job, [&](const auto& r) { return c->FinishReclaim(r); });
    case MessageType::kStats:
      return Serve<wire::Empty>(job, [&](const wire::Empty&) { return c->Stats(); });
    case MessageType::kStorageWrite:
      return Serve<StorageWriteRequest>(job, [&](const StorageWriteRequest& r) {
        // The controller's server's own writes (its process's client, e.g. a
        // co-located producer) are its word too.
        if (job.peer) return unit->Write(r);
        return open_writes_->Store(
            r, unit_index, [&] { return unit->Write(r); }, Steady::now());
      });
    case MessageType::kStorageRead:
      return Serve<StorageReadRequest>(job, [&](const auto& r) { return unit->Read(r); });
    case MessageType::kStorageDiscard:
      return Serve<StorageDiscardRequest>(job, [&](const StorageDiscardRequest& r) {
        // The controller's server's word: the cells of a write it aborted.
        if (job.peer) return unit->Discard(r);
        for (auto& [row, columns] : open_writes_->Discardable(r)) {
          SLUICE_RETURN_IF_ERROR(unit->Discard(StorageDiscardRequest{{row}, std::move(columns)}));
        }
        return Status::Ok();
      });
    case MessageType::kStorageFreeRows:
      return Serve<StorageFreeRequest>(job, [&](const StorageFreeRequest& r) {
        // The controller's server's word: rows it freed.
        if (job.peer) return unit->FreeRows(r);
        return Status::FailedPrecondition(
            "FreeRows is not served remotely: this server frees the rows of acked and cleared partitions itself "
            "(replies carry no reclaim ticket)");
      });
    case MessageType::kStorageStats:
      return Serve<wire::Empty>(job, [&](const wire::Empty&) { return unit->Stats(); });
    case MessageType::kShmStorageWrite:
      return Serve<wire::ShmWriteRequest>(job, [&](const auto& r) { return ShmWrite(r, unit_index); });
    case MessageType::kShmStorageRead:
      return Serve<StorageReadRequest>(job, [&](const auto& r) { return ShmRead(r, unit_index); });
  }
  return ErrorTo(job, Status::Internal("unhandled message type"));
}

}  // namespace sluice::transfer_queue
