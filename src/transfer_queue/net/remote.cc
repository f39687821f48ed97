// RemoteController and RemoteStorageUnit: the Controller and StorageUnit
// interfaces over an RpcChannel. Each method is one request/reply; the only
// logic here is how long a request may block on the server.
#include "sluice/transfer_queue/remote.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <utility>

#include "core/validation.h"
#include "net/rpc_channel.h"
#include "net/shm_arena.h"
#include "net/storage_hosts.h"
#include "sluice/common/logging.h"
#include "wire/wire.h"

namespace sluice::transfer_queue {
namespace {

using internal::RpcChannel;
using std::chrono::milliseconds;
using wire::MessageTraits;
using wire::MessageType;

// How long the server may hold a producer call waiting for capacity.
milliseconds Blocking(const CapacityWait& wait) {
  return wait.block ? std::max(wait.timeout, milliseconds(0)) : milliseconds(0);
}

class RemoteController final : public Controller {
 public:
  explicit RemoteController(std::shared_ptr<RpcChannel> channel) : channel_(std::move(channel)) {}

  Status RegisterColumns(const RegisterColumnsRequest& r) override {
    return Call<MessageType::kRegisterColumns>(r).status();
  }
  Status RegisterTask(const RegisterTaskRequest& r) override { return Call<MessageType::kRegisterTask>(r).status(); }
  Result<DescribeResponse> Describe() override { return Call<MessageType::kDescribe>(wire::Empty{}); }
  Result<CreatePartitionResponse> CreatePartition(const CreatePartitionRequest& r) override {
    return Call<MessageType::kCreatePartition>(r);
  }
  Result<CreateRowsResponse> CreateRows(const CreateRowsRequest& r) override {
    return Call<MessageType::kCreateRows>(r, Blocking(r.wait));
  }
  Result<BeginWriteResponse> BeginWrite(const BeginWriteRequest& r) override {
    return Call<MessageType::kBeginWrite>(r, Blocking(r.wait));
  }
  Status CommitWrite(const CommitWriteRequest& r) override { return Call<MessageType::kCommitWrite>(r).status(); }
  Status AbortWrite(const AbortWriteRequest& r) override { return Call<MessageType::kAbortWrite>(r).status(); }
  Result<BatchMeta> GetMeta(const GetMetaRequest& r) override {
    return Call<MessageType::kGetMeta>(r, std::max(r.timeout, milliseconds(0)));
  }
  Result<AckResponse> Ack(const AckRequest& r) override { return Call<MessageType::kAck>(r); }
  Result<ReleaseResponse> Release(const ReleaseRequest& r) override { return Call<MessageType::kRelease>(r); }
  Result<RenewResponse> Renew(const RenewRequest& r) override { return Call<MessageType::kRenew>(r); }
  Result<ReleaseHolderResponse> ReleaseHolder(const ReleaseHolderRequest& r) override {
    return Call<MessageType::kReleaseHolder>(r);
  }
  Result<ClearResponse> ClearPartition(const ClearPartitionRequest& r) override {
    return Call<MessageType::kClearPartition>(r);
  }
  Result<std::vector<KvEntry>> KvLookup(const KvLookupRequest& r) override { return Call<MessageType::kKvLookup>(r); }
  Result<std::vector<KvEntry>> KvList(const KvListRequest& r) override { return Call<MessageType::kKvList>(r); }
  Result<ClearResponse> KvClear(const KvClearRequest& r) override { return Call<MessageType::kKvClear>(r); }
  Status FinishReclaim(const FinishReclaimRequest& r) override { return Call<MessageType::kFinishReclaim>(r).status(); }
  Result<ControllerStats> Stats() override { return Call<MessageType::kStats>(wire::Empty{}); }
  void Close() override { closed_.store(true); }

 private:
  template <MessageType T>
  Result<typename MessageTraits<T>::Reply> Call(const typename MessageTraits<T>::Request& request,
                                                milliseconds blocking = milliseconds(0)) {
    if (closed_.load()) {
      return Status::Aborted("remote controller for " + channel_->endpoint() + " was closed");
    }
    return channel_->Call<typename MessageTraits<T>::Reply>(T, 0, request, blocking);
  }

  std::shared_ptr<RpcChannel> channel_;
  std::atomic<bool> closed_{false};
};

// With an arena, Write and Read move payloads through shared memory; the
// other calls are the same either way.
class RemoteStorageUnit final : public StorageUnit {
 public:
  RemoteStorageUnit(std::shared_ptr<RpcChannel> channel, uint32_t unit,
                    std::shared_ptr<internal::ShmArenaClient> arena = nullptr)
      : channel_(std::move(channel)), unit_(static_cast<uint16_t>(unit)), arena_(std::move(arena)) {}

  Status Write(const StorageWriteRequest& r) override {
    if (arena_) return ShmWrite(r);
    return Call<MessageType::kStorageWrite>(r).status();
  }
  Result<StorageReadResponse> Read(const StorageReadRequest& r) override {
    if (arena_) return ShmRead(r);
    return Call<MessageType::kStorageRead>(r);
  }
  Status Discard(const StorageDiscardRequest& r) override { return Call<MessageType::kStorageDiscard>(r).status(); }
  Status FreeRows(const StorageFreeRequest& r) override { return Call<MessageType::kStorageFreeRows>(r).status(); }
  Result<StorageStats> Stats() override { return Call<MessageType::kStorageStats>(wire::Empty{}); }

 private:
  template <MessageType T>
  Result<typename MessageTraits<T>::Reply> Call(const typename MessageTraits<T>::Request& request) {
    return channel_->Call<typename MessageTraits<T>::Reply>(T, unit_, request, milliseconds(0));
  }

  // Allocates the cells in the arena, then copies each payload in, once.
  // Pinned throughout: if the server gives up on the write meanwhile (it
  // expired), the blocks are not reused under the copy.
  Status ShmWrite(const StorageWriteRequest& r) {
    std::shared_ptr<const void> pin = arena_->Pin();
    wire::ShmWriteRequest request{r.write_id, {}};
    request.items.reserve(r.items.size());
    for (const StorageItem& item : r.items) {
      const HostTensor& t = item.tensor;
      if (t.data == nullptr && t.nbytes > 0) {
        return Status::InvalidArgument("write " + std::to_string(r.write_id) + ", row " + std::to_string(item.row) +
                                       ": data is null");
      }
      request.items.push_back(wire::ShmWriteItem{item.row, item.column, TensorMeta{t.dtype, t.shape, t.nbytes}});
    }
    SLUICE_ASSIGN_OR_RETURN(wire::ShmWriteReply reply, Call<MessageType::kShmStorageWrite>(request));
    if (reply.offsets.size() != r.items.size()) {
      return Status::DataLoss("ShmStorageWrite reply has " + std::to_string(reply.offsets.size()) + " offsets for " +
                              std::to_string(r.items.size()) + " cells");
    }
    for (size_t i = 0; i < r.items.size(); ++i) {
      const HostTensor& t = r.items[i].tensor;
      SLUICE_ASSIGN_OR_RETURN(HostTensor block, arena_->View(reply.offsets[i], t.dtype, t.shape, t.nbytes, pin));
      if (t.nbytes > 0) std::memcpy(const_cast<std::byte*>(block.data), t.data, t.nbytes);
    }
    return Status::Ok();
  }

  // Views of the arena, pinned for as long as any of them is held.
  Result<StorageReadResponse> ShmRead(const StorageReadRequest& r) {
    std::shared_ptr<const void> pin = arena_->Pin();
    SLUICE_ASSIGN_OR_RETURN(wire::ShmReadReply reply, Call<MessageType::kShmStorageRead>(r));
    const std::string what = "ShmStorageRead reply";
    if (reply.cells.size() != r.columns.size()) {
      return Status::DataLoss(what + " has " + std::to_string(reply.cells.size()) + " columns, asked for " +
                              std::to_string(r.columns.size()));
    }
    StorageReadResponse out;
    out.tensors.resize(reply.cells.size());
    for (size_t c = 0; c < reply.cells.size(); ++c) {
      if (reply.cells[c].size() != r.rows.size()) {
        return Status::DataLoss(what + " has " + std::to_string(reply.cells[c].size()) + " rows, asked for " +
                                std::to_string(r.rows.size()));
      }
      for (const wire::ShmCell& cell : reply.cells[c]) {
        SLUICE_RETURN_IF_ERROR(internal::ValidateTensorBytes(cell.meta, channel_->limits().max_tensor_bytes, what));
        SLUICE_ASSIGN_OR_RETURN(HostTensor view,
                                arena_->View(cell.offset, cell.meta.dtype, cell.meta.shape, cell.meta.nbytes, pin));
        out.tensors[c].push_back(std::move(view));
      }
    }
    return out;
  }

  std::shared_ptr<RpcChannel> channel_;
  const uint16_t unit_;
  std::shared_ptr<internal::ShmArenaClient> arena_;  // null: payloads in messages
};

// PutRows and TakeBatch: a put or a take in one round trip.
class RemoteFusedCalls final : public FusedCalls {
 public:
  RemoteFusedCalls(std::shared_ptr<RpcChannel> channel, std::shared_ptr<internal::ShmArenaClient> arena)
      : channel_(std::move(channel)), arena_(std::move(arena)) {}

  std::optional<Result<BeginWriteResponse>> Put(const BeginWriteRequest& begin, const ColumnBatch& columns,
                                                uint64_t payload_bytes) override {
    if (arena_ && payload_bytes > kFusedPutMaxBytes) return std::nullopt;  // one copy, into the arena
    wire::PutRequest request;
    request.begin = begin;
    request.data.reserve(begin.columns.size());
    for (const ColumnWriteMeta& column : begin.columns) request.data.push_back(columns.at(column.column));
    return channel_->Call<BeginWriteResponse>(MessageType::kPutRows, 0, request, Blocking(begin.wait));
  }

  Result<TakenBatch> Take(const GetMetaRequest& get, const std::vector<std::string>& columns,
                          LeaseId ack_first) override {
    wire::TakeRequest request{ack_first, get, columns, arena_ != nullptr};
    // Pinned before the request: the cells named in the reply are not reused
    // while the views below are held.
    std::shared_ptr<const void> pin = arena_ ? arena_->Pin() : nullptr;
    SLUICE_ASSIGN_OR_RETURN(
        wire::TakeReply reply,
        channel_->Call<wire::TakeReply>(MessageType::kTakeBatch, 0, request, std::max(get.timeout, milliseconds(0))));
    const std::string what = "TakeBatch reply";
    const std::vector<std::string>& names = columns.empty() ? reply.meta.columns : columns;
    const size_t rows = reply.meta.rows.size();
    const size_t got = reply.in_place ? reply.cells.size() : reply.data.size();
    if (reply.in_place != request.in_place || got != names.size()) {
      return Status::DataLoss(what + " has " + std::to_string(got) + " columns " +
                              (reply.in_place ? "in place" : "of bytes") + ", asked for " +
                              std::to_string(names.size()) + (request.in_place ? " in place" : " of bytes"));
    }
    TakenBatch out;
    out.data.rows = reply.meta.row_ids();
    for (size_t c = 0; c < names.size(); ++c) {
      std::vector<HostTensor>& dest = out.data.columns[names[c]];
      const size_t n = reply.in_place ? reply.cells[c].size() : reply.data[c].size();
      if (n != rows) {
        return Status::DataLoss(what + ": column '" + names[c] + "' has " + std::to_string(n) + " rows, the batch " +
                                std::to_string(rows));
      }
      if (!reply.in_place) {
        dest = std::move(reply.data[c]);
        continue;
      }
      dest.reserve(rows);
      for (const wire::ShmCell& cell : reply.cells[c]) {
        SLUICE_RETURN_IF_ERROR(internal::ValidateTensorBytes(cell.meta, channel_->limits().max_tensor_bytes, what));
        SLUICE_ASSIGN_OR_RETURN(HostTensor view,
                                arena_->View(cell.offset, cell.meta.dtype, cell.meta.shape, cell.meta.nbytes, pin));
        dest.push_back(std::move(view));
      }
    }
    out.meta = std::move(reply.meta);
    return out;
  }

 private:
  std::shared_ptr<RpcChannel> channel_;
  std::shared_ptr<internal::ShmArenaClient> arena_;  // null: bytes in messages
};

// The arena named by the server, as options.shm says: null to send payloads
// in messages.
Result<std::shared_ptr<internal::ShmArenaClient>> AttachArena(const std::string& endpoint, const wire::ServerInfo& info,
                                                              ShmMode mode) {
  if (mode == ShmMode::kOff) return std::shared_ptr<internal::ShmArenaClient>();
  if (info.shm_segment.empty()) {
    if (mode == ShmMode::kAuto) return std::shared_ptr<internal::ShmArenaClient>();
    return Status::FailedPrecondition("TransferQueue server " + endpoint +
                                      " has no shared-memory arena (RemoteOptions::shm is kRequired)");
  }
  Result<std::shared_ptr<internal::ShmArenaClient>> arena =
      internal::ShmArenaClient::Open(info.shm_segment, info.shm_data_bytes);
  if (arena.ok()) return arena;
  const std::string why =
      "cannot use the shared-memory arena of TransferQueue server " + endpoint + ": " + arena.status().ToString();
  if (mode == ShmMode::kRequired) return Status::FailedPrecondition(why);
  SLUICE_LOG(INFO) << why << "; payloads will travel in messages";
  return std::shared_ptr<internal::ShmArenaClient>();
}

Status CheckUnit(uint32_t unit) {
  if (unit >= wire::kMaxStorageUnits) {
    return Status::InvalidArgument("storage unit " + std::to_string(unit) + " is out of range (at most " +
                                   std::to_string(wire::kMaxStorageUnits) + " units)");
  }
  return Status::Ok();
}

// The server's ServerInfo, checked: its protocol and unit count.
Result<wire::ServerInfo> AskServerInfo(RpcChannel& channel, const std::string& endpoint) {
  Result<wire::ServerInfo> info =
      channel.Call<wire::ServerInfo>(MessageType::kServerInfo, 0, wire::Empty{}, milliseconds(0));
  if (!info.ok()) return info.status().WithContext("connecting to TransferQueue server " + endpoint);
  if (info->protocol_version != wire::kProtocolVersion) {
    return Status::Unimplemented("TransferQueue server " + endpoint + " speaks protocol version " +
                                 std::to_string(info->protocol_version) + ", this build speaks version " +
                                 std::to_string(wire::kProtocolVersion));
  }
  if (info->storage_units == 0 || info->storage_units > wire::kMaxStorageUnits) {
    return Status::DataLoss("TransferQueue server " + endpoint + " reports " + std::to_string(info->storage_units) +
                            " storage units");
  }
  return info;
}

// A channel to the storage server of `host`, checked against the hub.
Result<std::shared_ptr<RpcChannel>> ConnectStorageHost(const wire::UnitHost& host, uint32_t storage_units,
                                                       RemoteOptions options) {
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<RpcChannel> channel, RpcChannel::Create(host.endpoint, std::move(options)));
  SLUICE_ASSIGN_OR_RETURN(wire::ServerInfo info, AskServerInfo(*channel, host.endpoint));
  if (info.storage_units != storage_units) {
    return Status::FailedPrecondition("storage server " + host.endpoint + " serves a hub of " +
                                      std::to_string(info.storage_units) + " storage units, this one has " +
                                      std::to_string(storage_units));
  }
  channel->RaiseLimits(info);
  if (info.direct_port > 0 && info.direct_port <= 65535) channel->EnableDirect(static_cast<uint16_t>(info.direct_port));
  return channel;
}

}  // namespace

namespace internal {

Status CheckUnitHosts(const std::vector<wire::UnitHost>& hosts, uint32_t storage_units, const std::string& what) {
  std::vector<std::pair<uint32_t, uint32_t>> ranges;  // [first, end)
  for (const wire::UnitHost& h : hosts) {
    const uint64_t end = uint64_t{h.first_unit} + h.count;
    if (h.count == 0 || end > storage_units || h.endpoint.empty()) {
      return Status::InvalidArgument(what + ": storage units " + std::to_string(h.first_unit) + "+" +
                                     std::to_string(h.count) + " at '" + h.endpoint +
                                     "' are not a non-empty range of the hub's " + std::to_string(storage_units) +
                                     " units with an endpoint");
    }
    ranges.emplace_back(h.first_unit, static_cast<uint32_t>(end));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) {
      return Status::InvalidArgument(what + ": storage unit " + std::to_string(ranges[i].first) +
                                     " is served by two storage servers");
    }
  }
  return Status::Ok();
}

Result<std::unique_ptr<StorageHostLink>> StorageHostLink::Connect(const wire::UnitHost& host, uint32_t storage_units,
                                                                  const std::string& peer_token,
                                                                  std::chrono::milliseconds timeout) {
  RemoteOptions options;
  options.token = peer_token;
  options.shm = ShmMode::kOff;
  // A call waits at most 10 s (a dead storage server fails them in that), and
  // no longer than the whole connect may take.
  options.rpc_timeout = std::min<milliseconds>(timeout, milliseconds(10000));
  // The storage server may still be starting: ask until it answers or time runs out.
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Result<std::shared_ptr<RpcChannel>> channel = ConnectStorageHost(host, storage_units, options);
  while (!channel.ok() && channel.status().code() == StatusCode::kUnavailable &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(100));
    channel = ConnectStorageHost(host, storage_units, options);
  }
  if (!channel.ok()) return channel.status();
  std::unique_ptr<StorageHostLink> link(new StorageHostLink());
  link->host_ = host;
  link->channel_ = std::move(*channel);
  for (uint32_t u = host.first_unit; u < host.first_unit + host.count; ++u) {
    link->units_.push_back(std::make_shared<RemoteStorageUnit>(link->channel_, u));
  }
  return link;
}

Status StorageHostLink::Declare(const wire::DeclareWriteRequest& request) {
  return channel_->Call<wire::Empty>(MessageType::kDeclareWrite, 0, request, milliseconds(0))
      .status()
      .WithContext("declaring write " + std::to_string(request.write_id) + " to storage server " + host_.endpoint);
}

}  // namespace internal

Result<RemoteQueue> ConnectTransferQueue(const std::string& endpoint, RemoteOptions options) {
  const ShmMode shm_mode = options.shm;
  const RemoteOptions storage_options = options;
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<RpcChannel> channel, RpcChannel::Create(endpoint, std::move(options)));
  SLUICE_ASSIGN_OR_RETURN(const wire::ServerInfo info, AskServerInfo(*channel, endpoint));
  SLUICE_RETURN_IF_ERROR(
      internal::CheckUnitHosts(info.unit_hosts, info.storage_units, "TransferQueue server " + endpoint));
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<internal::ShmArenaClient> arena, AttachArena(endpoint, info, shm_mode));
  channel->RaiseLimits(info);
  // Same host (the arena opened) and the server serves rings: requests skip the socket.
  if (arena && info.shm_rings > 0) channel->EnableRings();
  if (info.direct_port > 0 && info.direct_port <= 65535) {
    channel->EnableDirect(static_cast<uint16_t>(info.direct_port));
  }
  RemoteQueue queue;
  if (arena) queue.shm_segment = arena->name();
  queue.endpoint = endpoint;
  queue.token_required = info.token_required;
  queue.controller = std::make_shared<RemoteController>(channel);
  // Units elsewhere: their bytes go to and come from their storage server,
  // and puts and takes go in steps (one round trip would pass the bytes
  // through the controller's server).
  if (info.unit_hosts.empty()) queue.fused = std::make_shared<RemoteFusedCalls>(channel, arena);
  queue.storage.resize(info.storage_units);
  for (const wire::UnitHost& host : info.unit_hosts) {
    RemoteOptions o = storage_options;
    o.shm = ShmMode::kOff;
    SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<RpcChannel> elsewhere,
                            ConnectStorageHost(host, info.storage_units, std::move(o)));
    for (uint32_t u = host.first_unit; u < host.first_unit + host.count; ++u) {
      queue.storage[u] = std::make_shared<RemoteStorageUnit>(elsewhere, u);
    }
  }
  for (uint32_t u = 0; u < info.storage_units; ++u) {
    if (!queue.storage[u]) queue.storage[u] = std::make_shared<RemoteStorageUnit>(channel, u, arena);
  }
  return queue;
}

Result<std::shared_ptr<Controller>> NewRemoteController(const std::string& endpoint, RemoteOptions options) {
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<RpcChannel> channel, RpcChannel::Create(endpoint, std::move(options)));
  return std::shared_ptr<Controller>(std::make_shared<RemoteController>(std::move(channel)));
}

Result<std::shared_ptr<StorageUnit>> NewRemoteStorageUnit(const std::string& endpoint, uint32_t unit,
                                                          RemoteOptions options) {
  SLUICE_RETURN_IF_ERROR(CheckUnit(unit));
  SLUICE_ASSIGN_OR_RETURN(std::shared_ptr<RpcChannel> channel, RpcChannel::Create(endpoint, std::move(options)));
  return std::shared_ptr<StorageUnit>(std::make_shared<RemoteStorageUnit>(std::move(channel), unit));
}

}  // namespace sluice::transfer_queue
